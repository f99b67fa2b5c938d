#include "worker/train/io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace ballast::train {

absl::StatusOr<DurableFile> DurableFile::Create(const std::string& path) {
  std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  return DurableFile(path, std::move(tmp), fd);
}

DurableFile::DurableFile(DurableFile&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      fd_(other.fd_),
      committed_(other.committed_) {
  other.fd_ = -1;
  other.committed_ = true;  // the moved-from object owns no temporary
}

DurableFile::~DurableFile() {
  if (fd_ >= 0) close(fd_);
  if (!committed_) unlink(tmp_.c_str());
}

absl::Status DurableFile::Append(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", tmp_));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status DurableFile::Commit() {
  if (fsync(fd_) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync ", tmp_));
  const int rc = close(fd_);  // close can report a failed write
  fd_ = -1;
  if (rc != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", tmp_));
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", tmp_, " to ", path_));
  }
  committed_ = true;
  const std::string dir = std::filesystem::path(path_).parent_path().string();
  const int dir_fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
