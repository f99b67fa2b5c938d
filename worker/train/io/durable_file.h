// DurableFile: a file written whole under a temporary name, then fsynced and
// renamed into place, so that a reader sees the old file or the complete new
// one, also after a crash. Writers of checkpoints and caches use it.
#ifndef BALLAST_WORKER_TRAIN_IO_DURABLE_FILE_H_
#define BALLAST_WORKER_TRAIN_IO_DURABLE_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ballast::train {

class DurableFile {
 public:
  // Creates `path`.tmp.PID. The errno's status naming it when that fails.
  static absl::StatusOr<DurableFile> Create(const std::string& path);
  DurableFile(DurableFile&& other) noexcept;
  DurableFile& operator=(DurableFile&&) = delete;
  // Without Commit, the temporary file is removed and `path` stays as it was.
  ~DurableFile();

  absl::Status Append(const void* data, size_t size);
  // fsync, rename over `path`, then fsync the folder so that the new name
  // survives a crash too.
  absl::Status Commit();

 private:
  DurableFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}

  std::string path_;
  std::string tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_DURABLE_FILE_H_
