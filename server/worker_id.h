// The form of a worker id: 1..128 characters of A-Z, a-z, 0-9, '.', '_' and
// '-'. Ids are printed in tables, logs and metric labels, so nothing else
// (no control character, no space) may be one.
#ifndef BALLAST_SERVER_WORKER_ID_H_
#define BALLAST_SERVER_WORKER_ID_H_

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/string_view.h"

namespace ballast::server {

inline constexpr size_t kMaxWorkerIdLength = 128;

inline bool IsWorkerId(absl::string_view id) {
  return !id.empty() && id.size() <= kMaxWorkerIdLength &&
         std::all_of(id.begin(), id.end(), [](char c) {
           return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                  c == '-';
         });
}

}  // namespace ballast::server

#endif  // BALLAST_SERVER_WORKER_ID_H_
