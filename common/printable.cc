#include "common/printable.h"

#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

// How many bytes of a control character start at text[i]: 1 for C0 and DEL,
// 2 for a C1 in UTF-8 (0xC2 0x80..0x9F), 0 for anything else.
size_t ControlBytesAt(absl::string_view text, size_t i) {
  const auto byte = static_cast<unsigned char>(text[i]);
  if (byte < 0x20 || byte == 0x7f) return 1;
  if (byte == 0xc2 && i + 1 < text.size()) {
    const auto next = static_cast<unsigned char>(text[i + 1]);
    if (next >= 0x80 && next <= 0x9f) return 2;
  }
  return 0;
}

}  // namespace

std::optional<size_t> FirstControlCharacter(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (ControlBytesAt(text, i) > 0) return i;
  }
  return std::nullopt;
}

std::string Printable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    switch (ControlBytesAt(text, i)) {
      case 1:
        absl::StrAppend(&out, "\\x",
                        absl::Hex(static_cast<unsigned char>(text[i]), absl::kZeroPad2));
        break;
      case 2:
        absl::StrAppend(&out, "\\u00",
                        absl::Hex(static_cast<unsigned char>(text[++i]), absl::kZeroPad2));
        break;
      default:
        out.push_back(text[i]);
    }
  }
  return out;
}

}  // namespace ballast
