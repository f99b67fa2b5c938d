// The tokenizer.json `normalizer`: none, or Unicode NFC (Qwen2/Qwen3), also
// when written as a Sequence of NFC steps (NFC is idempotent). Any other type
// is refused at load. Thread-safe.
//
// NFC as `tokenizers` computes it, which is not quite today's NFC: its
// tables (the `unicode-normalization-alignments` crate) are Unicode 9.0, so
// the combining marks assigned since then are inert starters there: never
// reordered, never composed. Normalize treats those code points the same
// way (kInertStarters in normalizer.cc, which also works around a utf8proc
// bug with U+11A7), and runs utf8proc's NFC on the text between them.
#ifndef BALLAST_WORKER_TRAIN_TEXT_NORMALIZER_H_
#define BALLAST_WORKER_TRAIN_TEXT_NORMALIZER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ballast::train {

class Normalizer {
 public:
  // From the json value of "normalizer" (null for none). INVALID_ARGUMENT
  // naming the type of an unsupported normalizer.
  static absl::StatusOr<Normalizer> FromJson(const nlohmann::json& normalizer);

  // `text` (valid UTF-8) normalized. INTERNAL when utf8proc fails (out of
  // memory).
  absl::StatusOr<std::string> Normalize(std::string_view text) const;

  // Whether Normalize can change anything.
  bool active() const { return nfc_; }

 private:
  explicit Normalizer(bool nfc) : nfc_(nfc) {}

  bool nfc_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_NORMALIZER_H_
