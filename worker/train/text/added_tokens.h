// Added tokens (tokenizer.json "added_tokens"): strings that become one id
// before the pre-tokenizer and BPE see the text, as Hugging Face's
// `tokenizer/added_vocabulary.rs` does it. Matching is leftmost-longest and
// non-overlapping; then, per match in order:
//  - a special token is skipped when special tokens are off;
//  - a single_word token is skipped when a word character (Rust regex \w)
//    touches it on either side;
//  - lstrip takes the whitespace before it, back to the previous match;
//    rstrip takes the whitespace after it.
// A skipped match still hides the text it covered from later matches, as in
// `tokenizers`. Thread-safe once built.
#ifndef BALLAST_WORKER_TRAIN_TEXT_ADDED_TOKENS_H_
#define BALLAST_WORKER_TRAIN_TEXT_ADDED_TOKENS_H_

#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "worker/train/text/bpe.h"

namespace ballast::train {

struct AddedToken {
  std::string content;
  TokenId id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  // Matched in the normalized text (true) or cut out of the raw text first.
  bool normalized = true;
  bool special = false;
};

// A stretch of text: one added token (`id` >= 0), or text between added
// tokens for the next stage (`id` == -1).
struct TextSegment {
  std::string_view text;
  TokenId id;
};

// Bytes [begin, end) of a text.
struct ByteRange {
  size_t begin;
  size_t end;
};

// Where special tokens are matched in a text: nowhere (`allow` false), or
// everywhere except where a match overlaps one of `plain`, byte ranges of
// the text (sorted, disjoint). A chat's message text is plain: it must not
// become a control token, while the template's own tokens around it do.
struct SpecialTokens {
  bool allow = false;
  absl::Span<const ByteRange> plain;

  bool Allows(size_t begin, size_t end) const;
  // The rule for the bytes [begin, end) of the text as a text of their own
  // once normalized, where offsets into the text are lost: every special
  // token when no plain range overlaps them, none otherwise.
  SpecialTokens Within(size_t begin, size_t end) const;
};

class AddedTokenMatcher {
 public:
  // Matches `token` where `pattern` occurs: its content, normalized for
  // normalized tokens. The first of two equal patterns wins.
  void Add(std::string_view pattern, const AddedToken& token);

  // Appends the segments of `text`, in order, to `segments`; the views point
  // into `text`. A special token is matched only where `special` allows it;
  // elsewhere its match is skipped.
  void Split(std::string_view text, const SpecialTokens& special,
             std::vector<TextSegment>* segments) const;

  // The special token whose pattern occurs first in `text`, the shortest at
  // that place; nullptr when none. Every occurrence counts, also one that
  // Split would skip (single_word) or hide behind an overlapping match: the
  // question is whether the text could become a control token at all.
  const AddedToken* FindSpecial(std::string_view text) const;

 private:
  struct Match {
    size_t start;
    size_t end;
    int32_t token;
  };
  // The leftmost-longest match at or after `from`; token -1 when none.
  Match Find(std::string_view text, size_t from) const;

  // A byte trie over the patterns: edges_ maps node * 256 + byte to the
  // child, token_at_ gives the token that ends at a node (-1 for none).
  absl::flat_hash_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> token_at_{-1};
  std::bitset<256> first_bytes_;
  std::vector<AddedToken> tokens_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_ADDED_TOKENS_H_
