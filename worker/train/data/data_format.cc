#include "worker/train/data/data_format.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ballast::train {

absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name) {
  if (name == "messages") return DataFormat::kMessages;
  if (name == "prompt_completion") return DataFormat::kPromptCompletion;
  if (name == "text") return DataFormat::kText;
  if (name == "tokens") return DataFormat::kTokens;
  if (name == "reranker") return DataFormat::kReranker;
  return absl::InvalidArgumentError(
      absl::StrCat("data.format = \"", name,
                   "\" is not one of messages, prompt_completion, text, tokens, reranker"));
}

absl::string_view DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kMessages:
      return "messages";
    case DataFormat::kPromptCompletion:
      return "prompt_completion";
    case DataFormat::kText:
      return "text";
    case DataFormat::kTokens:
      return "tokens";
    case DataFormat::kReranker:
      return "reranker";
  }
  return "unknown";
}

absl::StatusOr<DataFormat> DetectDataFormat(const nlohmann::json& record) {
  if (!record.is_object()) return absl::InvalidArgumentError("the record is not a JSON object");
  if (record.contains("positive_messages") || record.contains("query")) {
    return DataFormat::kReranker;
  }
  if (record.contains("messages")) return DataFormat::kMessages;
  if (record.contains("prompt") && record.contains("completion")) {
    return DataFormat::kPromptCompletion;
  }
  if (record.contains("text")) return DataFormat::kText;
  if (record.contains("input_ids")) return DataFormat::kTokens;
  return absl::InvalidArgumentError(
      "the record has none of the keys messages, prompt + completion, text, input_ids, query; "
      "set data.format");
}

namespace {

// The 0-based offset of the first byte past kMaxRecordDepth levels of
// nesting, or -1. Brackets inside strings do not count.
int64_t TooDeepAt(absl::string_view line) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxRecordDepth) return static_cast<int64_t>(i);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return -1;
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseRecord(absl::string_view line) {
  if (const size_t nul = line.find('\0'); nul != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a NUL byte at byte ", nul + 1, ": a line holds one JSON object and nothing else"));
  }
  if (const int64_t at = TooDeepAt(line); at >= 0) {
    return absl::InvalidArgumentError(absl::StrCat("the record nests deeper than ", kMaxRecordDepth,
                                                   " levels (at byte ", at + 1, ")"));
  }
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line.begin(), line.end());
  } catch (const nlohmann::json::parse_error& e) {
    // e.what() quotes the bytes last read, which may be invalid UTF-8; the
    // message says where and what instead.
    std::string what = e.what();
    if (const size_t quote = what.find("; last read"); quote != std::string::npos) {
      what.resize(quote);
    }
    if (const size_t colon = what.find(": "); colon != std::string::npos) what.erase(0, colon + 2);
    return absl::InvalidArgumentError(
        absl::StrCat("not a JSON object: at byte ", e.byte, ", ", what));
  } catch (const nlohmann::json::out_of_range& e) {
    // A number past double's range (1e400) is the one out_of_range that
    // parsing throws; its message names the number, which is plain ASCII.
    absl::string_view what = e.what();
    if (const size_t tag = what.find("] "); tag != absl::string_view::npos) {
      what.remove_prefix(tag + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat("not a JSON object: ", what));
  }
  if (!record.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a JSON object but a JSON ", record.type_name()));
  }
  return record;
}

}  // namespace ballast::train
