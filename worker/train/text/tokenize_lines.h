// TokenizeLines: `ballast-train tokenize`, the tokenizer and the chat
// templates as a filter, so that a user can check the ids a job trains on
// against their own tooling.
//
// Each input line is {"text": str} or {"messages": [{role, content,
// reasoning_content?}]}; each output line is {"ids": [...]}, with
// "assistant_masks" (1 = trained, as transformers names it) for messages,
// or {"error": "line N: ..."} for a line that fails, so that output lines
// stay aligned with input lines.
#ifndef BALLAST_WORKER_TRAIN_TEXT_TOKENIZE_LINES_H_
#define BALLAST_WORKER_TRAIN_TEXT_TOKENIZE_LINES_H_

#include <cstdint>
#include <istream>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::train {

struct TokenizeLinesOptions {
  // A tokenizer.json, or a folder with one (and tokenizer_config.json).
  std::string tokenizer;
  // For messages: qwen3, qwen3_5, chatml or llama3; empty detects it from the
  // folder's tokenizer_config.json.
  std::string chat_template;
  // Match special tokens inside text (transformers' default); a job's data
  // never does.
  bool allow_special = false;
  // For messages: mark every token trained, not only the assistant turns.
  bool train_on_all = false;
};

// The count of lines that failed. NOT_FOUND or INVALID_ARGUMENT when the
// tokenizer or a named template does not load; a missing template fails
// only the messages lines.
absl::StatusOr<int64_t> TokenizeLines(const TokenizeLinesOptions& options, std::istream& in,
                                      std::ostream& out);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_TOKENIZE_LINES_H_
