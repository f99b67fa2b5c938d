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

}  // namespace ballast::train
