// The tokenizer.json `model` of type BPE, byte-level: a vocabulary over the
// 256 symbols of byte_level.h and a ranked list of merges. A pre-token's
// bytes start as one symbol each; the pair with the lowest merge rank is
// merged first, the leftmost of equal ranks first, until no pair has a
// merge. The order and the check for stale pairs are those of Hugging Face's
// `models/bpe/word.rs`, so the ids are the same even where two merges make
// the same token. With `ignore_merges` (Llama 3) a pre-token that is itself
// in the vocabulary is one token.
//
// Refused at load: dropout (random merges), continuing_subword_prefix,
// end_of_word_suffix, byte_fallback, and a vocabulary that lacks one of the
// 256 byte symbols (Hugging Face would drop such bytes silently without an
// unk token). Thread-safe.
#ifndef BALLAST_WORKER_TRAIN_TEXT_BPE_H_
#define BALLAST_WORKER_TRAIN_TEXT_BPE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace ballast::train {

using TokenId = int32_t;

// `value` as a token id: an integer in 0..2^31-1, which `tokenizers` (u32
// ids) and the model's embedding both take. INVALID_ARGUMENT naming `where`
// otherwise; a float or an id out of range is never converted.
absl::StatusOr<TokenId> TokenIdFromJson(const nlohmann::json& value, absl::string_view where);

class Bpe {
 public:
  // From the json value of "model". Merges are ["a", "b"] pairs (the
  // writer since tokenizers 0.20) or legacy "a b" strings; rank = position.
  // INVALID_ARGUMENT naming the model type, the setting, or the merge whose
  // parts or result are not in the vocabulary.
  static absl::StatusOr<Bpe> FromJson(const nlohmann::json& model);

  // Appends the ids of one pre-token, given as its raw bytes, to `ids`. With
  // `ends`, also appends where each id's bytes end, counted from the start of
  // `bytes` (the ids cover `bytes` in order, without gaps).
  void Tokenize(std::string_view bytes, std::vector<TokenId>* ids,
                std::vector<size_t>* ends = nullptr) const;

  // The vocabulary's id of `token` (in byte symbols); -1 when absent.
  TokenId TokenToId(std::string_view token) const;

  // The token of `id` in byte symbols; nullptr when the vocabulary has none.
  const std::string* IdToToken(TokenId id) const;

  // How many tokens the vocabulary has.
  size_t vocab_size() const { return vocab_.size(); }

 private:
  struct Merge {
    int32_t rank;
    TokenId merged;
  };
  Bpe() = default;
  static uint64_t PairKey(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  absl::flat_hash_map<std::string, TokenId> vocab_;
  absl::flat_hash_map<TokenId, std::string> tokens_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::array<TokenId, 256> byte_ids_{};
  bool ignore_merges_ = false;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_BPE_H_
