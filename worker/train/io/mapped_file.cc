#include "worker/train/io/mapped_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/regular_file.h"

namespace ballast::train {

MappedFile::~MappedFile() {
  if (size_ > 0) munmap(const_cast<uint8_t*>(data_), size_);
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  absl::StatusOr<OpenedFile> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  const size_t size = static_cast<size_t>(opened->size);
  void* data = size == 0 ? nullptr : mmap(nullptr, size, PROT_READ, MAP_PRIVATE, opened->fd, 0);
  const int error = errno;
  close(opened->fd);  // the mapping outlives the descriptor
  if (data == MAP_FAILED) return absl::ErrnoToStatus(error, absl::StrCat("mmap ", path));
  return std::make_shared<const MappedFile>(static_cast<const uint8_t*>(data), size);
}

}  // namespace ballast::train
