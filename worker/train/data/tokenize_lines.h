// TokenizeLines: `ballast-train tokenize`, the tokenizer and the chat
// templates as a filter, so that a user can check the ids a job trains on
// against their own tooling.
//
// Each input line is {"text": str} or {"messages": [{role, content,
// reasoning_content?}]}, read as a job reads a record (ParseRecord: one JSON
// object and nothing after it); each output line is {"ids": [...]}, with
// "assistant_masks" (1 = trained, as transformers names it) for messages,
// or {"error": "line N: ..."} for a line that fails, so that output lines
// stay aligned with input lines.
//
// Special-token text (say "<|im_start|>" in a text) is treated as a job
// with the same data.allow_special_tokens treats it: off, a text encodes it
// as plain text and a chat is refused; on, it becomes the special token.
#ifndef BALLAST_WORKER_TRAIN_DATA_TOKENIZE_LINES_H_
#define BALLAST_WORKER_TRAIN_DATA_TOKENIZE_LINES_H_

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
  // Match special tokens inside text and message content (transformers'
  // default), as a job with data.allow_special_tokens does.
  bool allow_special = false;
  // For messages: mark every token trained, not only the assistant turns.
  bool train_on_all = false;
};

struct TokenizeLinesCounts {
  int64_t failed = 0;  // lines answered with an error
  // Lines encoded whose text held a special token's text, whether it became
  // plain text (allow_special off) or the token (on).
  int64_t special_token_text = 0;
};

// The counts of the lines read. NOT_FOUND or INVALID_ARGUMENT when the
// tokenizer or a named template does not load; a missing template fails
// only the messages lines.
absl::StatusOr<TokenizeLinesCounts> TokenizeLines(const TokenizeLinesOptions& options,
                                                  std::istream& in, std::ostream& out);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_TOKENIZE_LINES_H_
