#include "client/request_id.h"

#include <array>
#include <cstdint>
#include <random>

#include "absl/strings/str_format.h"

namespace ballast::client {

std::string NewRequestId() {
  std::random_device device;
  std::array<uint8_t, 16> b;
  for (uint8_t& byte : b) byte = static_cast<uint8_t>(device());
  b[6] = (b[6] & 0x0f) | 0x40;  // version 4
  b[8] = (b[8] & 0x3f) | 0x80;  // RFC 4122 variant
  return absl::StrFormat("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                         b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                         b[12], b[13], b[14], b[15]);
}

}  // namespace ballast::client
