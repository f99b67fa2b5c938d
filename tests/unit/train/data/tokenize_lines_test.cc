#include "worker/train/data/tokenize_lines.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/unit/train/text/tokenizer_json.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kEndOfText = 256, kImStart = 257, kImEnd = 258;

std::vector<int> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::vector<int> Concat(std::initializer_list<std::vector<int>> parts) {
  std::vector<int> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

// A byte-level tokenizer (ids 0..255) with ChatML's special tokens, in a
// tokenizer.json of its own.
class TokenizeLinesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "tokenize_lines_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    std::ofstream(path()) << WithSpecialTokens(QwenStyleJson({}),
                                               {"<|endoftext|>", "<|im_start|>", "<|im_end|>"},
                                               kEndOfText)
                                 .dump();
  }
  // remove_all would bind to a copy libtorch.so exports, which crashes.
  void TearDown() override {
    unlink(path().c_str());
    rmdir(dir_.c_str());
  }
  std::string path() const { return dir_ + "/tokenizer.json"; }

  // The output lines of `input`, with the counts in *counts.
  std::vector<nlohmann::json> Run(const std::string& input, bool allow_special,
                                  TokenizeLinesCounts* counts) {
    std::istringstream in(input);
    std::ostringstream out;
    absl::StatusOr<TokenizeLinesCounts> result = TokenizeLines(
        {.tokenizer = path(), .chat_template = "chatml", .allow_special = allow_special}, in, out);
    EXPECT_TRUE(result.ok()) << result.status();
    if (result.ok()) *counts = *result;
    std::vector<nlohmann::json> lines;
    std::istringstream replies(out.str());
    for (std::string line; std::getline(replies, line);)
      lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  std::string dir_;
};

// Issue 33's leftover: the tool read "{...}\0garbage" as the object, while a
// job refused the same line.
TEST_F(TokenizeLinesTest, ALineIsReadAsAJobReadsARecord) {
  TokenizeLinesCounts counts;
  const std::vector<nlohmann::json> out = Run(
      std::string("{\"text\": \"ab\"}\0garbage\n{\"text\": \"ab\"} x\n{\"text\": \"ab\"}\n", 55),
      false, &counts);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_THAT(out[0].value("error", ""), HasSubstr("line 1: a NUL byte at byte 15"));
  EXPECT_THAT(out[1].value("error", ""), HasSubstr("line 2: not a JSON object"));
  EXPECT_EQ(out[2]["ids"].get<std::vector<int>>(), Bytes("ab"));
  EXPECT_EQ(counts.failed, 2);
}

TEST_F(TokenizeLinesTest, SpecialTokenTextIsPlainTextUnlessAllowedAndCounted) {
  const std::string input =
      "{\"text\": \"a<|im_start|>b<|im_start|>\"}\n"
      "{\"text\": \"ab\"}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"q<|endoftext|>\"}, "
      "{\"role\": \"assistant\", \"content\": \"a\"}]}\n";
  TokenizeLinesCounts counts;
  std::vector<nlohmann::json> out = Run(input, false, &counts);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["ids"].get<std::vector<int>>(), Bytes("a<|im_start|>b<|im_start|>"));
  // The chat's message text is plain text; its template's tokens stay. The
  // chat's ids around its user turn's ids:
  const auto chat = [](const std::vector<int>& user) {
    return Concat({{kImStart},
                   Bytes("user\n"),
                   user,
                   {kImEnd},
                   Bytes("\n"),
                   {kImStart},
                   Bytes("assistant\na"),
                   {kImEnd},
                   Bytes("\n")});
  };
  EXPECT_EQ(out[2]["ids"].get<std::vector<int>>(), chat(Bytes("q<|endoftext|>")));
  EXPECT_EQ(counts.special_token_text, 2);  // records, not occurrences
  EXPECT_EQ(counts.failed, 0);

  out = Run(input, true, &counts);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0]["ids"].get<std::vector<int>>(),
            Concat({Bytes("a"), {kImStart}, Bytes("b"), {kImStart}}));
  EXPECT_EQ(out[2]["ids"].get<std::vector<int>>(), chat(Concat({Bytes("q"), {kEndOfText}})));
  EXPECT_EQ(counts.special_token_text, 2);
  EXPECT_EQ(counts.failed, 0);
}

}  // namespace
}  // namespace ballast::train
