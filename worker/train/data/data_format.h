// DataFormat: what one JSONL record of a training set holds, and how the
// trainer tells from the first record when the spec does not say; and
// ParseRecord, the one parse of a record's line that every reader shares.
#ifndef BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_
#define BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"

namespace ballast::train {

// The deepest nesting of arrays and objects a record may have. A chat with
// tool calls nests a few levels, their arguments a few more; a line of
// 16 MiB of "[" would parse into about 1 GiB of nodes.
inline constexpr int kMaxRecordDepth = 128;

enum class DataFormat {
  kMessages,          // {"messages": [{"role", "content", "reasoning_content"?}, ...]}
  kPromptCompletion,  // {"prompt": str | messages, "completion": str | messages}
  kText,              // {"text": str}: continued pretraining, every token trained
  kTokens,            // {"input_ids": [int], "labels"?: [int]}: already tokenized
  kReranker,          // {"query", "positive", "negative"} and kin (reranker_records.h)
};

// Every key a record of some format is read by, with DetectDataFormat's and
// reranker_records.h's variants: a parquet or Arrow data set's columns of
// these names become a row's record, its other columns are not read.
inline constexpr const char* kRecordKeys[] = {"messages",
                                              "prompt",
                                              "completion",
                                              "text",
                                              "input_ids",
                                              "labels",
                                              "query",
                                              "positive",
                                              "positives",
                                              "pos",
                                              "negative",
                                              "negatives",
                                              "neg",
                                              "response",
                                              "rejected_response",
                                              "positive_messages",
                                              "negative_messages"};

// The spec's name of a format (data.format); INVALID_ARGUMENT listing the
// names otherwise.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
absl::string_view DataFormatName(DataFormat format);

// The format of `record` by its keys: "positive_messages" or "query" make
// kReranker; then in the order above, so that a record with "messages" is
// kMessages even if it has "text" too. INVALID_ARGUMENT, naming
// the keys looked for, when it has none of them or is not an object.
absl::StatusOr<DataFormat> DetectDataFormat(const nlohmann::json& record);

// One JSONL line as a JSON object. INVALID_ARGUMENT saying what is wrong (the
// caller adds file and line) when it is not exactly one object: malformed
// JSON (invalid UTF-8 in a string, a lone surrogate escape), anything but
// whitespace after the object, a NUL byte anywhere (the JSON parser would
// take one for the end of the text and accept what came before it), or
// nesting deeper than kMaxRecordDepth, which is refused before anything is
// parsed.
absl::StatusOr<nlohmann::json> ParseRecord(absl::string_view line);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_DATA_FORMAT_H_
