#include "worker/train/text/normalizer.h"

#include <cstdlib>
#include <memory>

#include "absl/strings/str_cat.h"
#include "utf8proc.h"

namespace ballast::train {

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
  utf8proc_uint8_t* composed = nullptr;
  // With an explicit length (no UTF8PROC_NULLTERM) a NUL in the text is a
  // character like any other. The tokenizer hands over valid UTF-8 only.
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owner(composed, &std::free);
  if (length < 0) {
    return absl::InternalError(absl::StrCat("NFC normalization failed: ", utf8proc_errmsg(length)));
  }
  return std::string(reinterpret_cast<const char*>(composed), length);
}

}  // namespace ballast::train
