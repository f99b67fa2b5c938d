#include "worker/train/text/added_tokens.h"

#include <algorithm>

#include "utf8proc.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

// Unicode White_Space, what Rust's regex \s matches.
bool IsWhitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The word characters of Unicode 16, which the Rust regex crate in
// `tokenizers` 0.22.2 knows, that utf8proc's Unicode 15 tables lack. Found by
// asking `tokenizers` about every code point; the parity test
// (tests/parity/test_tokenizer.py) asks again, so a change on either side
// fails there.
constexpr CodePointRange kWordCharactersNewerThanUtf8proc[] = {
    {0x897, 0x897},     {0x1C89, 0x1C8A},   {0xA7CB, 0xA7CD},   {0xA7DA, 0xA7DC},
    {0x105C0, 0x105F3}, {0x10D40, 0x10D65}, {0x10D69, 0x10D6D}, {0x10D6F, 0x10D85},
    {0x10EC2, 0x10EC4}, {0x10EFC, 0x10EFC}, {0x11380, 0x11389}, {0x1138B, 0x1138B},
    {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113C0}, {0x113C2, 0x113C2},
    {0x113C5, 0x113C5}, {0x113C7, 0x113CA}, {0x113CC, 0x113D3}, {0x113E1, 0x113E2},
    {0x116D0, 0x116E3}, {0x11BC0, 0x11BE0}, {0x11BF0, 0x11BF9}, {0x11F5A, 0x11F5A},
    {0x13460, 0x143FA}, {0x16100, 0x16139}, {0x16D40, 0x16D6C}, {0x16D70, 0x16D79},
    {0x18CFF, 0x18CFF}, {0x1CCF0, 0x1CCF9}, {0x1E5D0, 0x1E5FA}, {0x2EBF0, 0x2EE5D},
};

// Rust's regex \w: Alphabetic, marks, decimal digits, connector punctuation
// and the joiners. Alphabetic is the letters, letter numbers, and
// Other_Alphabetic: marks (already in) and the circled and squared Latin
// letters, which are So.
bool IsWordCharacter(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) ||
             (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
             (c >= 0x1F170 && c <= 0x1F189) || InRanges(c, kWordCharactersNewerThanUtf8proc);
  }
}

char32_t LastCodePoint(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) --start;
  return NextCodePoint(text, &start);
}

// Where the whitespace that `text` ends with begins.
size_t TrailingWhitespaceStart(std::string_view text) {
  size_t start = text.size();
  while (start > 0) {
    size_t lead = start - 1;
    while (lead > 0 && (static_cast<uint8_t>(text[lead]) & 0xC0) == 0x80) --lead;
    size_t pos = lead;
    if (!IsWhitespace(NextCodePoint(text, &pos))) break;
    start = lead;
  }
  return start;
}

// How many bytes of whitespace `text` starts with.
size_t LeadingWhitespaceLength(std::string_view text) {
  size_t end = 0;
  while (end < text.size()) {
    size_t pos = end;
    if (!IsWhitespace(NextCodePoint(text, &pos))) break;
    end = pos;
  }
  return end;
}

}  // namespace

void AddedTokenMatcher::Add(std::string_view pattern, const AddedToken& token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (const char c : pattern) {
    const uint64_t key = static_cast<uint64_t>(node) * 256 + static_cast<uint8_t>(c);
    const auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(token_at_.size()));
    if (inserted) token_at_.push_back(-1);
    node = it->second;
  }
  if (token_at_[node] >= 0) return;
  token_at_[node] = static_cast<int32_t>(tokens_.size());
  tokens_.push_back(token);
  first_bytes_.set(static_cast<uint8_t>(pattern[0]));
}

AddedTokenMatcher::Match AddedTokenMatcher::Find(std::string_view text, size_t from) const {
  for (size_t start = from; start < text.size(); ++start) {
    if (!first_bytes_.test(static_cast<uint8_t>(text[start]))) continue;
    Match longest{start, start, -1};
    int32_t node = 0;
    for (size_t pos = start; pos < text.size(); ++pos) {
      const auto it =
          edges_.find(static_cast<uint64_t>(node) * 256 + static_cast<uint8_t>(text[pos]));
      if (it == edges_.end()) break;
      node = it->second;
      if (token_at_[node] >= 0) longest = Match{start, pos + 1, token_at_[node]};
    }
    if (longest.token >= 0) return longest;
  }
  return Match{text.size(), text.size(), -1};
}

const AddedToken* AddedTokenMatcher::FindSpecial(std::string_view text) const {
  for (size_t start = 0; start < text.size(); ++start) {
    if (!first_bytes_.test(static_cast<uint8_t>(text[start]))) continue;
    int32_t node = 0;
    for (size_t pos = start; pos < text.size(); ++pos) {
      const auto it =
          edges_.find(static_cast<uint64_t>(node) * 256 + static_cast<uint8_t>(text[pos]));
      if (it == edges_.end()) break;
      node = it->second;
      if (token_at_[node] >= 0 && tokens_[token_at_[node]].special) {
        return &tokens_[token_at_[node]];
      }
    }
  }
  return nullptr;
}

bool SpecialTokens::Allows(size_t begin, size_t end) const {
  if (!allow) return false;
  // The first range that ends after `begin` is the only one that can overlap.
  const auto after =
      std::upper_bound(plain.begin(), plain.end(), begin,
                       [](size_t at, const ByteRange& range) { return at < range.end; });
  return after == plain.end() || after->begin >= end;
}

SpecialTokens SpecialTokens::Within(size_t begin, size_t end) const {
  if (!Allows(begin, end)) return SpecialTokens{.allow = false};
  return SpecialTokens{.allow = true};
}

void AddedTokenMatcher::Split(std::string_view text, const SpecialTokens& special,
                              std::vector<TextSegment>* segments) const {
  size_t segment_start = 0;
  for (Match match = Find(text, 0); match.token >= 0; match = Find(text, match.end)) {
    const AddedToken& token = tokens_[match.token];
    if (token.special && !special.Allows(match.start, match.end)) continue;
    if (token.single_word) {
      const bool word_before =
          match.start > 0 && IsWordCharacter(LastCodePoint(text.substr(0, match.start)));
      size_t after = match.end;
      const bool word_after = after < text.size() && IsWordCharacter(NextCodePoint(text, &after));
      if (word_before || word_after) continue;
    }
    size_t start = match.start;
    size_t end = match.end;
    if (token.lstrip) {
      start = std::max(TrailingWhitespaceStart(text.substr(0, start)), segment_start);
    }
    if (token.rstrip) end += LeadingWhitespaceLength(text.substr(end));
    if (segment_start < start) {
      segments->push_back(TextSegment{text.substr(segment_start, start - segment_start), -1});
    }
    segments->push_back(TextSegment{text.substr(start, end - start), token.id});
    segment_start = end;
  }
  if (segment_start < text.size()) {
    segments->push_back(TextSegment{text.substr(segment_start), -1});
  }
}

}  // namespace ballast::train
