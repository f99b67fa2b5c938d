// The tokenizer.json `pre_tokenizer` of byte-level BPE models: zero or more
// Split steps (a regex or a literal, behavior "Isolated": every match and
// every stretch between matches is a pre-token), then ByteLevel with
// add_prefix_space and use_regex false. This is Qwen2/Qwen3's and Llama 3's
// Sequence[Split(Regex R, Isolated), ByteLevel]. Anything else (another
// type, another behavior, invert, a prefix space, ByteLevel's own GPT-2
// regex) is refused at load, so a model is never split differently from
// Hugging Face's `tokenizers` without saying so.
//
// Regexes run on PCRE2 with PCRE2_UTF | PCRE2_UCP, so \p{L}, \s and (?i:...)
// are Unicode-aware as in Oniguruma, which `tokenizers` uses, and their
// classes are spelt out to Oniguruma's Unicode tables first
// (oniguruma_classes.h); JIT-compiled when the platform has a JIT.
// Thread-safe: matching state lives per call.
#ifndef BALLAST_WORKER_TRAIN_TEXT_PRE_TOKENIZER_H_
#define BALLAST_WORKER_TRAIN_TEXT_PRE_TOKENIZER_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

struct pcre2_real_code_8;

namespace ballast::train {

// One compiled Split step.
class SplitPattern {
 public:
  // `pattern` is a regex in Oniguruma syntax, or a literal when `literal`.
  // INVALID_ARGUMENT with PCRE2's message when the regex does not compile,
  // or as OnigurumaClassesForPcre2.
  static absl::StatusOr<SplitPattern> Compile(std::string_view pattern, bool literal);

  // Appends the pieces of `text` (valid UTF-8), in order and covering all of
  // it, to `pieces`: each non-empty match and each non-empty stretch between
  // matches, as views into `text`. INTERNAL when PCRE2 fails to match (a
  // resource limit), naming its error.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  struct CodeDeleter {
    void operator()(pcre2_real_code_8* code) const;
  };
  explicit SplitPattern(pcre2_real_code_8* code) : code_(code) {}

  std::unique_ptr<pcre2_real_code_8, CodeDeleter> code_;
};

class PreTokenizer {
 public:
  // From the json value of "pre_tokenizer". INVALID_ARGUMENT naming the
  // unsupported type or setting.
  static absl::StatusOr<PreTokenizer> FromJson(const nlohmann::json& pre_tokenizer);

  // Appends the pre-tokens of `text` (valid UTF-8) to `pieces` as views into
  // `text`; their bytes go to the byte-level BPE model one pre-token at a
  // time. INTERNAL as SplitPattern::Split.
  absl::Status Split(std::string_view text, std::vector<std::string_view>* pieces) const;

 private:
  explicit PreTokenizer(std::vector<SplitPattern> steps) : steps_(std::move(steps)) {}

  std::vector<SplitPattern> steps_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_PRE_TOKENIZER_H_
