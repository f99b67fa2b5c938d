// The tokenizer the text and data fuzz targets encode with: Qwen's regex and
// NFC, merges that make words and numbers, and special tokens, so that every
// stage of Encode has work to do. Built from tests/unit's tokenizer.json
// helpers.
#ifndef BALLAST_TESTS_FUZZ_FIXED_TOKENIZER_H_
#define BALLAST_TESTS_FUZZ_FIXED_TOKENIZER_H_

#include <utility>

#include "tests/fuzz/invariant.h"
#include "tests/unit/train/text/tokenizer_json.h"
#include "worker/train/text/tokenizer.h"

namespace ballast::fuzz {

// A new one each call (a Tokenizer is move-only); its special tokens have
// the last ids.
inline train::Tokenizer BuildFixedTokenizer() {
  nlohmann::json json = train::QwenStyleJson({{"t", "h"}, {"th", "e"}, {" ", "the"}, {"1", "2"}});
  const int first_id = static_cast<int>(json["model"]["vocab"].size());
  json = train::WithSpecialTokens(json, {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}, first_id);
  absl::StatusOr<train::Tokenizer> built = train::Tokenizer::FromJson(json);
  Require(built.ok(), "the fixed tokenizer loads", built.status());
  return *std::move(built);
}

}  // namespace ballast::fuzz

#endif  // BALLAST_TESTS_FUZZ_FIXED_TOKENIZER_H_
