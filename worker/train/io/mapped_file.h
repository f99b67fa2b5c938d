// MappedFile: a whole regular file mapped read-only, for readers that view
// large files in place (safetensors, the token cache) without copying them.
#ifndef BALLAST_WORKER_TRAIN_IO_MAPPED_FILE_H_
#define BALLAST_WORKER_TRAIN_IO_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::train {

class MappedFile {
 public:
  // Maps `path`, opened by OpenRegularFile (common/regular_file.h): without
  // blocking, so a FIFO is refused instead of waited on, and within the path
  // roots when the process is confined; errors as its, and the errno's status
  // naming the file when it cannot be mapped.
  // MAP_PRIVATE keeps the view stable against writers that replace the file
  // by rename; truncating a mapped file in place is outside the contract.
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  MappedFile(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const uint8_t* data_;
  size_t size_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_MAPPED_FILE_H_
