#include "worker/train/text/bpe.h"

#include <limits>
#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/train/text/byte_level.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

absl::Status Unsupported(const std::string& setting, const nlohmann::json& value) {
  return absl::InvalidArgumentError(
      absl::StrCat("model BPE with ", setting, "=", value.dump(), " is not supported"));
}

// One merge parsed from either json spelling.
absl::StatusOr<std::pair<std::string, std::string>> MergeParts(const nlohmann::json& merge) {
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
    return std::make_pair(merge[0].get<std::string>(), merge[1].get<std::string>());
  }
  if (merge.is_string()) {
    const std::string line = merge.get<std::string>();
    const size_t space = line.find(' ');
    if (space != std::string::npos && line.find(' ', space + 1) == std::string::npos) {
      return std::make_pair(line.substr(0, space), line.substr(space + 1));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("model.merges entry ", merge.dump(), " is neither [\"a\", \"b\"] nor \"a b\""));
}

// One pair waiting in the merge queue, ordered as word.rs orders it: lowest
// rank first, then leftmost.
struct Candidate {
  int32_t rank;
  size_t pos;
  TokenId merged;
  bool operator>(const Candidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

// A symbol of the word being merged: a doubly linked list over a vector, so
// a merge costs O(1) and positions stay stable.
struct Symbol {
  TokenId id;
  int prev;
  int next;
  bool removed;
};

}  // namespace

absl::StatusOr<TokenId> TokenIdFromJson(const nlohmann::json& value, absl::string_view where) {
  // is_number_integer holds for both signed and unsigned json integers.
  const bool fits = value.is_number_unsigned()
                        ? value.get<uint64_t>() <= std::numeric_limits<TokenId>::max()
                        : value.is_number_integer() && value.get<int64_t>() >= 0 &&
                              value.get<int64_t>() <= std::numeric_limits<TokenId>::max();
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(where, " = ", value.dump(),
                                                   " is not a token id (an integer in 0..",
                                                   std::numeric_limits<TokenId>::max(), ")"));
  }
  return static_cast<TokenId>(value.get<int64_t>());
}

absl::StatusOr<Bpe> Bpe::FromJson(const nlohmann::json& model) {
  const std::string type = model.is_object() ? model.value("type", "") : "";
  if (type != "BPE") {
    return absl::InvalidArgumentError(
        absl::StrCat("model type \"", type, "\" is not supported (only BPE)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && !model[key].is_null() && model[key] != "") {
      return Unsupported(key, model[key]);
    }
  }
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0.0) {
    return Unsupported("dropout", model["dropout"]);
  }
  if (model.value("byte_fallback", false)) return Unsupported("byte_fallback", true);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("model.vocab is missing or not an object");
  }
  if (!model.contains("merges") || !model["merges"].is_array()) {
    return absl::InvalidArgumentError("model.merges is missing or not an array");
  }

  Bpe bpe;
  bpe.ignore_merges_ = model.value("ignore_merges", false);
  for (const auto& [token, value] : model["vocab"].items()) {
    absl::StatusOr<TokenId> id =
        TokenIdFromJson(value, absl::StrCat("model.vocab[", nlohmann::json(token).dump(), "]"));
    if (!id.ok()) return id.status();
    bpe.vocab_[token] = *id;
    bpe.tokens_[*id] = token;
  }
  for (int byte = 0; byte < 256; ++byte) {
    std::string symbol;
    AppendUtf8(ByteSymbol(static_cast<uint8_t>(byte)), &symbol);
    const TokenId id = bpe.TokenToId(symbol);
    if (id < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("model.vocab has no token for byte 0x%02X (symbol \"%s\"); byte-level "
                          "BPE needs all 256",
                          byte, symbol));
    }
    bpe.byte_ids_[byte] = id;
  }
  int32_t rank = 0;
  for (const nlohmann::json& merge : model["merges"]) {
    // Legacy merges.txt headers, which tokenizers skips without a rank.
    if (merge.is_string() && merge.get<std::string>().starts_with("#version")) continue;
    absl::StatusOr<std::pair<std::string, std::string>> parts = MergeParts(merge);
    if (!parts.ok()) return parts.status();
    const auto& [left, right] = *parts;
    const TokenId left_id = bpe.TokenToId(left);
    const TokenId right_id = bpe.TokenToId(right);
    const TokenId merged = bpe.TokenToId(left + right);
    if (left_id < 0 || right_id < 0 || merged < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.merges[", rank, "] ", merge.dump(), ": \"",
          left_id < 0 ? left : (right_id < 0 ? right : left + right), "\" is not in model.vocab"));
    }
    // A repeated pair takes its last rank: tokenizers collects the list
    // into a map, where a later entry overwrites an earlier one.
    bpe.merges_.insert_or_assign(PairKey(left_id, right_id), Merge{rank, merged});
    ++rank;
  }
  return bpe;
}

TokenId Bpe::TokenToId(std::string_view token) const {
  // Debian's abseil has its own string_view, which std::string_view must be
  // spelt as for a lookup without a copy.
  const auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* Bpe::IdToToken(TokenId id) const {
  const auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

void Bpe::Tokenize(std::string_view bytes, std::vector<TokenId>* ids,
                   std::vector<size_t>* ends) const {
  if (bytes.empty()) return;
  if (ignore_merges_) {
    if (const TokenId whole = TokenToId(BytesToSymbols(bytes)); whole >= 0) {
      ids->push_back(whole);
      if (ends != nullptr) ends->push_back(bytes.size());
      return;
    }
  }
  std::vector<Symbol> word(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) {
    word[i] = Symbol{byte_ids_[static_cast<uint8_t>(bytes[i])], static_cast<int>(i) - 1,
                     i + 1 < bytes.size() ? static_cast<int>(i) + 1 : -1, false};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto push_pair = [&](size_t pos) {
    const Symbol& left = word[pos];
    if (left.next < 0) return;
    const auto it = merges_.find(PairKey(left.id, word[left.next].id));
    if (it != merges_.end()) queue.push(Candidate{it->second.rank, pos, it->second.merged});
  };
  for (size_t pos = 0; pos + 1 < word.size(); ++pos) push_pair(pos);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = word[top.pos];
    if (left.removed || left.next < 0) continue;
    // A queued pair is stale once either side has merged with something
    // else; word.rs tells by the merge result, and so must this, since two
    // different pairs may make the same token.
    const auto it = merges_.find(PairKey(left.id, word[left.next].id));
    if (it == merges_.end() || it->second.merged != top.merged) continue;
    Symbol& right = word[left.next];
    left.id = top.merged;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) word[right.next].prev = static_cast<int>(top.pos);
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  // A symbol starts at its byte's index, so it ends where the next begins.
  for (const Symbol& symbol : word) {
    if (symbol.removed) continue;
    ids->push_back(symbol.id);
    if (ends != nullptr) ends->push_back(symbol.next >= 0 ? symbol.next : bytes.size());
  }
}

}  // namespace ballast::train
