// A multipart/form-data body (RFC 7578), as the OpenAI client uploads a file:
// the parts, each with its form field name, its filename when it is a file,
// and its bytes. Strict, as it reads what anyone may send: a body that
// departs from the grammar (no closing delimiter, a part without
// Content-Disposition: form-data and a name, headers past kMaxPartHeadBytes,
// more than kMaxParts parts) is INVALID_ARGUMENT saying what is wrong,
// never a guess. Debian's MIME libraries (GMime, mimetic, vmime) parse mail,
// with GLib or their own message trees, and Boost has no form parser, hence
// this one; tests/fuzz/multipart_form_fuzz.cc holds it to its contract.
#ifndef BALLAST_COMMON_MULTIPART_FORM_H_
#define BALLAST_COMMON_MULTIPART_FORM_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ballast {

inline constexpr size_t kMaxParts = 16;
inline constexpr size_t kMaxPartHeadBytes = 8 * 1024;

struct FormPart {
  // Content-Disposition's name and filename (empty when it has none).
  std::string name;
  std::string filename;
  // Empty when the part has none.
  std::string content_type;
  // Into the body given to ParseMultipartForm.
  absl::string_view data;
};

// The boundary of a `multipart/form-data; boundary=...` Content-Type (the
// parameter quoted or not, 1..70 characters); INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> FormBoundary(absl::string_view content_type);

// The parts of `body`, sent with `content_type`, in order. The parts' data
// points into `body`, which must outlive them.
absl::StatusOr<std::vector<FormPart>> ParseMultipartForm(absl::string_view content_type,
                                                         absl::string_view body);

}  // namespace ballast

#endif  // BALLAST_COMMON_MULTIPART_FORM_H_
