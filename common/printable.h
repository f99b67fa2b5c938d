// Text from one user shown to another: job names, worker ids, failure
// reasons and log lines reach other users' terminals, where a control
// character could clear the screen, move the cursor or forge a row. The
// control characters are C0 (below U+0020), DEL, and C1 (U+0080..U+009F,
// CSI among them) as UTF-8 writes them.
#ifndef BALLAST_COMMON_PRINTABLE_H_
#define BALLAST_COMMON_PRINTABLE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace ballast {

// The byte offset of the first control character in `text`, or nullopt.
std::optional<size_t> FirstControlCharacter(absl::string_view text);

// `text` with its control characters written as \xNN (C0, DEL) or \u00NN
// (C1), so that printing it cannot move the cursor, change colours or start
// a new line. Everything else, other UTF-8 included, is kept as it is.
std::string Printable(absl::string_view text);

}  // namespace ballast

#endif  // BALLAST_COMMON_PRINTABLE_H_
