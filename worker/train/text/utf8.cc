#include "worker/train/text/utf8.h"

#include <algorithm>
#include <cstdint>

namespace ballast::train {
namespace {

// The length of the well-formed sequence that starts at bytes[pos], or the
// length of its longest well-formed prefix negated (at least -1) when it is
// cut short or broken. Table 3-7 of the Unicode standard: the second byte's
// range depends on the lead byte, which rules out overlongs and surrogates.
int SequenceLength(std::string_view bytes, size_t pos) {
  const auto lead = static_cast<uint8_t>(bytes[pos]);
  if (lead < 0x80) return 1;
  int length = 0;
  uint8_t low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return -i;
    const auto byte = static_cast<uint8_t>(bytes[pos + i]);
    if (byte < low || byte > high) return -i;
    low = 0x80;
    high = 0xBF;
  }
  return length;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    const int length = SequenceLength(text, pos);
    if (length < 0) return false;
    pos += length;
  }
  return true;
}

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto lead = static_cast<uint8_t>(text[*pos]);
  int length = 1;
  char32_t code_point = lead;
  if (lead >= 0xF0) {
    length = 4;
    code_point = lead & 0x07;
  } else if (lead >= 0xE0) {
    length = 3;
    code_point = lead & 0x0F;
  } else if (lead >= 0xC0) {
    length = 2;
    code_point = lead & 0x1F;
  }
  for (int i = 1; i < length; ++i) {
    code_point = (code_point << 6) | (static_cast<uint8_t>(text[*pos + i]) & 0x3F);
  }
  *pos += length;
  return code_point;
}

void AppendUtf8(char32_t code_point, std::string* out) {
  if (code_point < 0x80) {
    out->push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else if (code_point < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code_point >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const int length = SequenceLength(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      AppendUtf8(U'\uFFFD', &out);
      pos += -length;
    }
  }
  return out;
}

bool InRanges(char32_t code_point, absl::Span<const CodePointRange> ranges) {
  // The last range that starts at or before the code point is the only one
  // that can hold it.
  const auto after =
      std::partition_point(ranges.begin(), ranges.end(),
                           [code_point](const CodePointRange& r) { return r.first <= code_point; });
  return after != ranges.begin() && code_point <= (after - 1)->last;
}

}  // namespace ballast::train
