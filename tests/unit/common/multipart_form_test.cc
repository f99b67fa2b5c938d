#include "common/multipart_form.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

using ::testing::HasSubstr;

constexpr char kType[] = "multipart/form-data; boundary=b0undary";

// A form as httpx (the openai package's HTTP client) writes it.
std::string Form(const std::string& purpose, const std::string& data) {
  return absl::StrCat("--b0undary\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n",
                      purpose,
                      "\r\n--b0undary\r\nContent-Disposition: form-data; name=\"file\"; "
                      "filename=\"train.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n",
                      data, "\r\n--b0undary--\r\n");
}

TEST(MultipartFormTest, ReadsTheFieldsAndTheFileBytesAsSent) {
  std::mt19937 random(std::random_device{}());
  // Any bytes, CRLFs and dashes included, but never the delimiter itself.
  std::string data(1 + random() % 5000, '\0');
  for (char& c : data) c = "ab\r\n-\0\xff"[random() % 7];
  const std::string body = Form("fine-tune", data);
  absl::StatusOr<std::vector<FormPart>> parts = ParseMultipartForm(kType, body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "purpose");
  EXPECT_EQ((*parts)[0].data, "fine-tune");
  EXPECT_EQ((*parts)[0].filename, "");
  EXPECT_EQ((*parts)[1].name, "file");
  EXPECT_EQ((*parts)[1].filename, "train.jsonl");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  EXPECT_EQ((*parts)[1].data, data);
}

TEST(MultipartFormTest, QuotedBoundaryAndEscapedFilenameAndPreamble) {
  const std::string body =
      "ignored preamble\r\n--a;b\r\nContent-Disposition: form-data; name=\"file\"; "
      "filename=\"x\\\"y;z.jsonl\"\r\n\r\nDATA\r\n--a;b--";
  absl::StatusOr<std::vector<FormPart>> parts =
      ParseMultipartForm("Multipart/Form-Data; boundary=\"a;b\"", body);
  ASSERT_TRUE(parts.ok()) << parts.status();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].filename, "x\"y;z.jsonl");
  EXPECT_EQ((*parts)[0].data, "DATA");
}

TEST(MultipartFormTest, RefusesWhatDepartsFromTheGrammarSayingWhat) {
  const auto error = [](const std::string& type, const std::string& body) {
    absl::StatusOr<std::vector<FormPart>> parts = ParseMultipartForm(type, body);
    EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument) << body;
    return std::string(parts.status().message());
  };
  EXPECT_THAT(error("application/json", "{}"), HasSubstr("is multipart/form-data"));
  EXPECT_THAT(error("multipart/form-data", "x"), HasSubstr("no boundary"));
  EXPECT_THAT(error(absl::StrCat("multipart/form-data; boundary=", std::string(71, 'b')), ""),
              HasSubstr("71 characters"));
  EXPECT_THAT(error(kType, "no delimiter at all"), HasSubstr("no boundary delimiter"));
  std::string cut = Form("fine-tune", "data");
  cut.resize(cut.size() - 16);
  EXPECT_THAT(error(kType, cut), HasSubstr("ends inside a part"));
  EXPECT_THAT(error(kType,
                    "--b0undary\r\nContent-Disposition: attachment; name=\"f\"\r\n\r\nx"
                    "\r\n--b0undary--"),
              HasSubstr("not form-data"));
  EXPECT_THAT(error(kType, "--b0undary\r\nContent-Type: text/plain\r\n\r\nx\r\n--b0undary--"),
              HasSubstr("no 'Content-Disposition: form-data; name=...'"));
  EXPECT_THAT(error(kType, "--b0undary\r\nContent-Disposition: form-data; name=\"f"),
              HasSubstr("do not end"));
  EXPECT_THAT(error(kType, "--b0undaryX"), HasSubstr("not followed by CRLF"));
  std::string many;
  for (size_t i = 0; i <= kMaxParts; ++i) {
    absl::StrAppend(&many, "--b0undary\r\nContent-Disposition: form-data; name=\"p", i,
                    "\"\r\n\r\nv\r\n");
  }
  EXPECT_THAT(error(kType, many + "--b0undary--"), HasSubstr("more than 16 parts"));
}

}  // namespace
}  // namespace ballast
