// The two uses ballastd makes of OpenSSL's crypto: SHA-256 digests (of token
// secrets, which are stored only as their digest, and of uploaded files,
// recorded beside them) and random hex from its CSPRNG (token secrets and
// ids, uploaded files' ids), so that no one can guess another's.
#ifndef BALLAST_SERVER_CRYPTO_H_
#define BALLAST_SERVER_CRYPTO_H_

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace ballast::server {

// The 32 raw bytes of SHA-256(data).
std::string Sha256(absl::string_view data);

// Hex of `bytes` bytes from OpenSSL's CSPRNG.
std::string RandomHex(size_t bytes);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_CRYPTO_H_
