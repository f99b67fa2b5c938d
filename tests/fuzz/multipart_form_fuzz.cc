// Fuzzes the multipart/form-data parser that reads uploads to ballastd's
// OpenAI-compatible API (common/multipart_form.h), which anyone with a
// token may send.
//
// Input: the Content-Type's boundary parameter up to the first newline,
// then the body.
//
// Invariants beyond not crashing: an error is INVALID_ARGUMENT; parsed, there
// are at most kMaxParts parts, each with a name, and each part's data lies
// inside the body and is not followed by the delimiter's start inside it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/multipart_form.h"
#include "tests/fuzz/invariant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using ballast::fuzz::Require;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  const absl::string_view boundary = input.substr(0, newline);
  const absl::string_view body =
      newline == absl::string_view::npos ? absl::string_view() : input.substr(newline + 1);
  const std::string type = absl::StrCat("multipart/form-data; boundary=", boundary);
  absl::StatusOr<std::vector<ballast::FormPart>> parts = ballast::ParseMultipartForm(type, body);
  if (!parts.ok()) {
    Require(parts.status().code() == absl::StatusCode::kInvalidArgument,
            "a bad form is INVALID_ARGUMENT");
    return 0;
  }
  Require(parts->size() <= ballast::kMaxParts, "at most kMaxParts parts");
  const std::string delimiter = absl::StrCat("\r\n--", *ballast::FormBoundary(type));
  for (const ballast::FormPart& part : *parts) {
    Require(!part.name.empty(), "every part has a name");
    Require(part.data.data() >= body.data() &&
                part.data.data() + part.data.size() <= body.data() + body.size(),
            "a part's data lies in the body");
    Require(part.data.find(delimiter) == absl::string_view::npos,
            "no part's data holds the delimiter");
  }
  return 0;
}
