// Tokenizer: a Hugging Face tokenizer.json of the byte-level BPE family
// (Qwen2/Qwen2.5/Qwen3, Llama 3) that encodes and decodes exactly as the
// Python `tokenizers` package does. Encoding runs, as `tokenizers` does:
//   1. added tokens with normalized=false are cut out of the raw text;
//   2. the normalizer (NFC, or none) runs on the stretches between them;
//   3. added tokens with normalized=true are cut out of the normalized text;
//   4. the pre-tokenizer splits what is left, and BPE turns each piece's
//      bytes into ids.
// Every component of the json it does not implement (another model type,
// normalizer, pre-tokenizer, decoder or post-processor; truncation or
// padding) fails Load with INVALID_ARGUMENT naming it, so a model is never
// tokenized differently from `tokenizers` without an error.
//
// Encode adds no BOS or EOS, whatever the post-processor says (it is
// `tokenizers`' encode with add_special_tokens=False): chat templates write
// their own special tokens. template_prefix() and template_suffix() tell
// what the post-processor would have added, for plain text that wants it.
//
// Thread-safe: all methods are const; one Tokenizer serves many threads.
#ifndef BALLAST_WORKER_TRAIN_TEXT_TOKENIZER_H_
#define BALLAST_WORKER_TRAIN_TEXT_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "worker/train/text/added_tokens.h"
#include "worker/train/text/bpe.h"
#include "worker/train/text/normalizer.h"
#include "worker/train/text/pre_tokenizer.h"

namespace ballast::train {

// The largest tokenizer.json read; real ones are up to about 35 MB (Gemma 3).
inline constexpr int64_t kMaxTokenizerJsonBytes = int64_t{256} << 20;

class Tokenizer {
 public:
  // Encode's ids and where each one's text lies.
  struct Encoding {
    std::vector<TokenId> ids;
    // The text as the ids cover it: Normalize(text, allow_special).
    std::string normalized;
    // ends[i] is the offset in `normalized` just past ids[i]'s text, which
    // starts at ends[i - 1] (0 for the first): the ids cover `normalized` in
    // order, without gaps. An added token's text includes the whitespace its
    // lstrip or rstrip took, so it can be longer than the token.
    std::vector<size_t> ends;
  };

  // Reads `path_or_dir`: a tokenizer.json, or a model folder holding one.
  // NOT_FOUND naming the file when it is missing; INVALID_ARGUMENT naming
  // the file when it is not a regular file, is past kMaxTokenizerJsonBytes
  // or is not JSON, and the component and its type when it is not supported.
  static absl::StatusOr<Tokenizer> Load(const std::string& path_or_dir);

  // From the parsed json of a tokenizer.json. INVALID_ARGUMENT as Load.
  static absl::StatusOr<Tokenizer> FromJson(const nlohmann::json& json);

  // The ids of `text`. With `allow_special` false, special added tokens are
  // not matched and their text is encoded as plain text (for user content,
  // which must not produce control tokens); other added tokens still are,
  // as with `tokenizers`' encode_special_tokens=True. INVALID_ARGUMENT when
  // `text` is not valid UTF-8; INTERNAL when the regex engine fails.
  absl::StatusOr<std::vector<TokenId>> Encode(std::string_view text, bool allow_special) const;

  // Encode, with where each id's text ends. Errors as Encode.
  absl::StatusOr<Encoding> EncodeWithOffsets(std::string_view text, bool allow_special) const;

  // EncodeWithOffsets with special tokens matched where `special` allows
  // them: a chat's template tokens, and not the text of its messages. A
  // special token matched in the normalized text (none in the byte-level
  // vocabularies this reads) is matched only in a stretch between raw added
  // tokens that no plain range overlaps.
  absl::StatusOr<Encoding> EncodeWithOffsets(std::string_view text,
                                             const SpecialTokens& special) const;

  // `text` as Encode's ids spell it: the added tokens matched in the raw
  // text kept as they are, the stretches between them normalized. Equal to
  // `text` without a normalizer. INVALID_ARGUMENT when `text` is not valid
  // UTF-8; INTERNAL when the normalizer fails (out of memory).
  absl::StatusOr<std::string> Normalize(std::string_view text, bool allow_special) const;

  // The content of a special added token that Encode with special tokens on
  // could find in `text` (anywhere, also where single_word or an overlapping
  // match would stop it; normalized tokens in `text` normalized); nullopt
  // when there is none. For text that must not carry control tokens, which
  // Encode would turn into them silently. Errors as Normalize.
  absl::StatusOr<std::optional<std::string>> FindSpecialToken(std::string_view text) const;

  // The text of `ids`, special tokens included; bytes that do not form
  // UTF-8 (a character cut by the end of `ids`) read as U+FFFD.
  // OUT_OF_RANGE naming the first id that has no token.
  absl::StatusOr<std::string> Decode(absl::Span<const TokenId> ids) const;

  // The id of `token` (an added token's content, or a vocabulary token in
  // byte symbols); -1 when there is none.
  TokenId TokenToId(std::string_view token) const;

  // What the post-processor (TemplateProcessing) puts before and after a
  // single sequence: Llama 3's {<|begin_of_text|>} and {}; empty for Qwen.
  const std::vector<TokenId>& template_prefix() const { return template_prefix_; }
  const std::vector<TokenId>& template_suffix() const { return template_suffix_; }

 private:
  Tokenizer(Bpe bpe, Normalizer normalizer, PreTokenizer pre_tokenizer)
      : bpe_(std::move(bpe)),
        normalizer_(std::move(normalizer)),
        pre_tokenizer_(std::move(pre_tokenizer)) {}

  // Encode into `ids`; with `offsets`, also appends to its `normalized` and
  // `ends` (`ids` may be offsets->ids).
  absl::Status EncodeInto(std::string_view text, const SpecialTokens& special,
                          std::vector<TokenId>* ids, Encoding* offsets) const;

  // Steps 2 to 4 of the class comment on one stretch of raw text; appends
  // to `offsets` as EncodeInto.
  absl::Status EncodeStretch(std::string_view text, const SpecialTokens& special,
                             std::vector<TokenId>* ids, Encoding* offsets) const;

  Bpe bpe_;
  Normalizer normalizer_;
  PreTokenizer pre_tokenizer_;
  AddedTokenMatcher raw_added_;
  AddedTokenMatcher normalized_added_;
  // Whether a special token is matched in the normalized text, so that
  // FindSpecialToken must normalize.
  bool normalized_special_ = false;
  absl::flat_hash_map<TokenId, std::string> added_content_;
  absl::flat_hash_map<std::string, TokenId> added_ids_;
  std::vector<TokenId> template_prefix_;
  std::vector<TokenId> template_suffix_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_TOKENIZER_H_
