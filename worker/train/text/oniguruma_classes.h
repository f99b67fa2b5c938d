// Oniguruma's character classes spelt for PCRE2. `tokenizers` matches the
// pre-tokenizer regex with Oniguruma, whose Unicode tables (16.0 in
// tokenizers 0.22) are newer than PCRE2 10.42's (14.0), and whose \s is
// Unicode White_Space where PCRE2's also takes U+180E. The same regex would
// split some text differently on PCRE2; this rewrite makes PCRE2 match the
// code points Oniguruma matches:
//   \p{L} \p{N} \p{M}  gain the code points Oniguruma has in them and
//                      PCRE2 does not (letters, digits and marks assigned in
//                      Unicode 15 and 16);
//   \s \S              become White_Space and its complement.
// What reads differently in Oniguruma's Ruby syntax and is not rewritten is
// refused: escapes whose sets may differ (\w, \d, \b, \h, \v, other \p{...}
// classes), nested classes and && inside [...], the line anchors ^ and $,
// and inline options other than i. Stateless.
#ifndef BALLAST_WORKER_TRAIN_TEXT_ONIGURUMA_CLASSES_H_
#define BALLAST_WORKER_TRAIN_TEXT_ONIGURUMA_CLASSES_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ballast::train {

// `regex` (Oniguruma syntax, as in tokenizer.json) with its classes spelt
// for PCRE2 with PCRE2_UTF | PCRE2_UCP. INVALID_ARGUMENT naming what the
// regex uses that is refused, or \P{..} or \S inside [...].
absl::StatusOr<std::string> OnigurumaClassesForPcre2(std::string_view regex);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TEXT_ONIGURUMA_CLASSES_H_
