#include "worker/train/io/record_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

// The reflected CRC-32 of polynomial 0x1EDC6F41 (Castagnoli), from Boost.CRC
// (libboost-dev, which the HTTP server's Beast already needs): Debian 12
// packages neither Google's crc32c library nor an abseil with absl/crc, and
// table-driven bytes are ample for a record per training step.
using Crc32cComputer = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

constexpr uint32_t kMaskDelta = 0xa282ead8u;

// The low `bytes` bytes of `v`, least significant first, whatever the host's
// byte order.
void StoreLittleEndian(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  Crc32cComputer crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string FrameRecord(absl::string_view record) {
  std::string framed(record.size() + 16, '\0');
  char* p = framed.data();
  StoreLittleEndian(record.size(), 8, p);
  StoreLittleEndian(MaskedCrc32c(absl::string_view(p, 8)), 4, p + 8);
  record.copy(p + 12, record.size());
  StoreLittleEndian(MaskedCrc32c(record), 4, p + 12 + record.size());
  return framed;
}

absl::StatusOr<RecordFile> RecordFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  return RecordFile(path, fd);
}

RecordFile::RecordFile(RecordFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

RecordFile& RecordFile::operator=(RecordFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

RecordFile::~RecordFile() {
  if (fd_ >= 0) close(fd_);
}

absl::Status RecordFile::Append(absl::string_view record) {
  const std::string framed = FrameRecord(record);
  absl::string_view left = framed;
  while (!left.empty()) {
    const ssize_t n = write(fd_, left.data(), left.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot append to ", path_));
    left.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
