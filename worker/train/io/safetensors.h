// safetensors: read (memory-mapped) and write the HF safetensors format.
//
// Every file is validated before any tensor is handed out, by the header
// parser of safetensors_header.h (the format and its rules are there). An
// error names the file and, where it applies, the tensor. Reads never go out
// of bounds. Thread-compatible; a SafetensorsFile is immutable once opened.
#ifndef BALLAST_WORKER_TRAIN_IO_SAFETENSORS_H_
#define BALLAST_WORKER_TRAIN_IO_SAFETENSORS_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::train {

// One memory-mapped .safetensors file.
class SafetensorsFile {
 public:
  // Maps and validates `path`. Errors: NOT_FOUND for a missing file,
  // DATA_LOSS for a corrupt or truncated one (message names file and tensor).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();

  const std::string& path() const;
  // Tensor names in file order (ascending data offset).
  const std::vector<std::string>& names() const;
  bool contains(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const;
  // A CPU tensor that views the mapped bytes (no copy, read-only: do not write
  // to it). It keeps the mapping alive. NOT_FOUND when the name is absent.
  absl::StatusOr<at::Tensor> tensor(const std::string& name) const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// A checkpoint folder: model.safetensors, or model.safetensors.index.json with
// its shards (also adapter_model.safetensors via `file_name`).
class SafetensorsCheckpoint {
 public:
  // Opens `dir/file_name`, or `dir/<file_name>.index.json` and every shard it
  // names. Errors name the missing or corrupt file.
  static absl::StatusOr<SafetensorsCheckpoint> Open(
      const std::string& dir, const std::string& file_name = "model.safetensors");
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  absl::StatusOr<at::Tensor> tensor(const std::string& name) const;

 private:
  std::map<std::string, std::shared_ptr<SafetensorsFile>> by_name_;
};

// Writes `tensors` (any of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL; made
// contiguous, moved to CPU) to `path` atomically: a temporary file in the same
// folder, fsync, then rename. Offsets are in map order, 8-byte aligned header.
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, at::Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_SAFETENSORS_H_
