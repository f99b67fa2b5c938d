#include "worker/train/text/normalizer.h"

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "utf8proc.h"
#include "worker/train/text/utf8.h"

namespace ballast::train {
namespace {

// The code points that NFC must leave as inert starters (never reordered,
// never composed) to match `tokenizers`, as inclusive ranges: U+11A7, the
// Hangul trailing-consonant base, which is no trailing consonant but which
// utf8proc 2.6 composes into (and so drops after) a preceding LV syllable;
// and those that have NFC data (a combining class) in utf8proc's Unicode 15
// tables but none in the Unicode 9.0 tables of `tokenizers`. Found by comparing the NFC of
// `tokenizers` 0.22 with Python's unicodedata on probe strings around every code point that
// utf8proc gives NFC data; the parity test (tests/parity/test_tokenizer.py) probes every code point
// again, so a newer utf8proc that knows more marks fails there rather than here in silence.
constexpr CodePointRange kInertStarters[] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x11A7, 0x11A7},
    {0x1715, 0x1715},   {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},
    {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50},
    {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E},
    {0x11839, 0x1183A}, {0x1193D, 0x1193E}, {0x11943, 0x11943}, {0x119E0, 0x119E0},
    {0x11A34, 0x11A34}, {0x11A47, 0x11A47}, {0x11A99, 0x11A99}, {0x11D42, 0x11D42},
    {0x11D44, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1},
    {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
    {0x1E4EC, 0x1E4EF},
};

bool IsInertStarter(char32_t code_point) { return InRanges(code_point, kInertStarters); }

// utf8proc's NFC of `text` (valid UTF-8) appended to `out`.
absl::Status AppendNfc(std::string_view text, std::string* out) {
  if (text.empty()) return absl::OkStatus();
  utf8proc_uint8_t* composed = nullptr;
  // With an explicit length (no UTF8PROC_NULLTERM) a NUL in the text is a
  // character like any other.
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(composed, &std::free);
  if (length < 0) {
    return absl::InternalError(absl::StrCat("NFC normalization failed: ", utf8proc_errmsg(length)));
  }
  out->append(reinterpret_cast<const char*>(composed), length);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Normalizer> Normalizer::FromJson(const nlohmann::json& normalizer) {
  if (normalizer.is_null()) return Normalizer(false);
  const std::string type = normalizer.value("type", "");
  if (type == "NFC") return Normalizer(true);
  if (type == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    bool nfc = false;
    for (const nlohmann::json& step : normalizer["normalizers"]) {
      absl::StatusOr<Normalizer> inner = FromJson(step);
      if (!inner.ok()) return inner.status();
      nfc = nfc || inner->nfc_;
    }
    return Normalizer(nfc);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("normalizer type \"", type, "\" is not supported (only NFC, or none)"));
}

absl::StatusOr<std::string> Normalizer::Normalize(std::string_view text) const {
  if (!nfc_) return std::string(text);
  // ASCII is its own NFC, and most training text is mostly ASCII.
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);
  // An inert starter blocks reordering and composition across it, so the
  // text on either side normalizes on its own.
  std::string normalized;
  normalized.reserve(text.size());
  size_t stretch_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t start = pos;
    if (!IsInertStarter(NextCodePoint(text, &pos))) continue;
    if (absl::Status status =
            AppendNfc(text.substr(stretch_start, start - stretch_start), &normalized);
        !status.ok()) {
      return status;
    }
    normalized.append(text.substr(start, pos - start));
    stretch_start = pos;
  }
  if (absl::Status status = AppendNfc(text.substr(stretch_start), &normalized); !status.ok()) {
    return status;
  }
  return normalized;
}

}  // namespace ballast::train
