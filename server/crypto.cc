#include "server/crypto.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "absl/strings/escaping.h"

namespace ballast::server {

std::string Sha256(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size()));
  return absl::BytesToHexString(raw);
}

}  // namespace ballast::server
