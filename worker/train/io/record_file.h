// RecordFile: a TFRecord file written record by record, the framing of
// TensorBoard's event files. Each record on disk is
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   the record's bytes | uint32 masked CRC32C of the record's bytes
// where the mask is ((crc >> 15) | (crc << 17)) + 0xa282ead8 (TensorFlow's
// lib/io/record_writer and crc32c.h): a reader checks both sums, so a record
// torn by a crash ends the file for it, and the mask keeps a CRC of bytes
// that hold CRCs (a file of files) from being trivially predictable.
//
// Each record goes to the kernel in one write() and nothing is buffered, so
// a reader that follows the file (`tensorboard --logdir`) sees every
// appended record. The file is opened for appending: reopening one never
// cuts what it holds.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_IO_RECORD_FILE_H_
#define BALLAST_WORKER_TRAIN_IO_RECORD_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ballast::train {

// CRC32C (Castagnoli, iSCSI's): crc32c("123456789") is 0xE3069283.
uint32_t Crc32c(absl::string_view data);
// TFRecord's masked CRC32C of `data` (the mask above).
uint32_t MaskedCrc32c(absl::string_view data);
// `record` framed as above: 16 bytes longer than it.
std::string FrameRecord(absl::string_view record);

class RecordFile {
 public:
  // Opens `path` for appending, creating it when missing. The errno's status
  // naming the file when that fails.
  static absl::StatusOr<RecordFile> Open(const std::string& path);
  RecordFile(RecordFile&& other) noexcept;
  RecordFile& operator=(RecordFile&& other) noexcept;
  ~RecordFile();

  // Appends one framed record. The errno's status naming the file when the
  // write fails (ENOSPC); the file may then end in a torn record, which
  // readers skip.
  absl::Status Append(absl::string_view record);

  const std::string& path() const { return path_; }

 private:
  RecordFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_IO_RECORD_FILE_H_
