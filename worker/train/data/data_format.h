// DataFormat: what one JSONL record of a training set holds, and how the
// trainer tells from the first record when the spec does not say.
#ifndef BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_
#define BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace ballast::train {

enum class DataFormat {
  kMessages,          // {"messages": [{"role", "content", "reasoning_content"?}, ...]}
  kPromptCompletion,  // {"prompt": str | messages, "completion": str | messages}
  kText,              // {"text": str}: continued pretraining, every token trained
  kTokens,            // {"input_ids": [int], "labels"?: [int]}: already tokenized
  kReranker,          // {"query", "positive", "negative"} and kin (reranker_records.h)
};

// The spec's name of a format (data.format); INVALID_ARGUMENT listing the
// names otherwise.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
absl::string_view DataFormatName(DataFormat format);

// The format of `record` by its keys: "positive_messages" or "query" make
// kReranker; then in the order above, so that a record with "messages" is
// kMessages even if it has "text" too. INVALID_ARGUMENT, naming
// the keys looked for, when it has none of them or is not an object.
absl::StatusOr<DataFormat> DetectDataFormat(const nlohmann::json& record);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_
