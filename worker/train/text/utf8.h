// UTF-8 helpers of the tokenizer: validation, walking code points, the
// lossy conversion that Hugging Face's decoders end with, and lookups in
// tables of code point ranges. Stateless and thread-safe.
#ifndef BALLAST_WORKER_TRAIN_TEXT_UTF8_H_
#define BALLAST_WORKER_TRAIN_TEXT_UTF8_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/types/span.h"

namespace ballast::train {

// Whether `text` is well-formed UTF-8 (no overlongs, no surrogates, nothing
// above U+10FFFF): what a Python str can hold, and what PCRE2 needs.
bool IsValidUtf8(std::string_view text);

// The code point that starts at text[*pos], which must be valid UTF-8;
// advances *pos past it.
char32_t NextCodePoint(std::string_view text, size_t* pos);

// Appends the UTF-8 encoding of `code_point` to `out`.
void AppendUtf8(char32_t code_point, std::string* out);

// `bytes` as UTF-8, each maximal ill-formed subpart replaced by U+FFFD: the
// policy of Rust's String::from_utf8_lossy, which the ByteLevel decoder uses,
// so a decode that cuts a character in two reads the same as in Python.
std::string Utf8Lossy(std::string_view bytes);

// An inclusive range of code points.
struct CodePointRange {
  char32_t first;
  char32_t last;
};

// Whether `code_point` is in one of `ranges`, which are sorted and disjoint.
bool InRanges(char32_t code_point, absl::Span<const CodePointRange> ranges);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_UTF8_H_
