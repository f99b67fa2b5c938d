// Reading the files a user names (a spec's model and data paths), which may
// be anything: opening a FIFO to read blocks until a writer comes, and a
// corrupt config.json may be gigabytes. Every read here opens without
// blocking, refuses what is not a regular file, and bounds what it holds in
// memory, so bad input gets an error, never a hang or an allocation failure.
#ifndef BALLAST_COMMON_REGULAR_FILE_H_
#define BALLAST_COMMON_REGULAR_FILE_H_

#include <time.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast {

// A model's config.json is a few KiB; one past this is corrupt.
inline constexpr int64_t kMaxConfigJsonBytes = int64_t{1} << 20;

// The whole of `path`, a regular file of at most `max_bytes`. Errors name
// the file: NOT_FOUND when it is missing, INVALID_ARGUMENT when it is not a
// regular file (saying what it is), is a file of one of the kernel's pseudo
// file systems (/proc, /sys and kin, whose files are made up as they are
// read), cannot be opened or read (EACCES, EIO), or is larger than
// max_bytes.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes);

// OK when `path` is a regular file (after symlinks); errors as
// ReadRegularFile's. Opens it without blocking and reads nothing.
absl::Status CheckRegularFile(const std::string& path);

// An open descriptor of a regular file, which the caller closes, and its
// size and modification time when it was opened.
struct OpenedFile {
  int fd = -1;
  int64_t size = 0;
  struct timespec mtime {};
};

// Opens `path` as ReadRegularFile does (errors as its), for a caller that
// reads it its own way (a memory map).
absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path);

// Confines every later open of this file's functions (and of everything that
// opens through them) in this process: a path under one of `roots`, as
// written or with the roots' own symlinks resolved, must lead to a file under
// one of them. The check reads the path of the open descriptor
// (/proc/self/fd), so it holds for the file actually read: a symlink swapped
// in after CheckSpecPaths looked cannot lead the read out, as it could
// between a check of the path and an open of it. INVALID_ARGUMENT names the
// path, where it led and the roots. Paths outside every root (a job's own
// output and cache folders) open as before; no roots (the default) confines
// nothing. ballast-train sets its --path-root here before it reads the spec's
// files. Thread-safe.
void ConfineOpensBeneath(const std::vector<std::string>& roots);

// True when `path`'s components begin with all of `root`'s: /data/a is under
// /data, /data-b is not. Lexical: resolve symlinks and ".." first.
bool IsPathUnder(const std::filesystem::path& path, const std::filesystem::path& root);

// The lines of a regular file, one at a time, each at most max_line_bytes
// (without its newline). A file whose name ends in ".zst" is decompressed as
// it is read (zstd frames, as the `zstd` tool writes them). It reads the
// bytes the file had when it was opened, and no more: a file appended to for
// ever still ends. Thread-compatible.
class LineReader {
 public:
  // Errors as ReadRegularFile's.
  static absl::StatusOr<LineReader> Open(const std::string& path, int64_t max_line_bytes);
  LineReader(LineReader&&) noexcept;
  LineReader& operator=(LineReader&&) noexcept;
  ~LineReader();

  // The next line into `*line` (a last line without a newline counts): true,
  // or false at the end of the file. INVALID_ARGUMENT "path:N: ..." for a
  // line longer than max_line_bytes, which is never read into memory whole;
  // INVALID_ARGUMENT "path: ..." for a read error (EIO), for a file that
  // changed while it was read (it grew, shrank or was written to: what was
  // read may hold lines of two versions), and for zstd data that is corrupt
  // or cut short.
  absl::StatusOr<bool> Next(std::string* line);
  // 1-based number of the line Next returned last.
  int64_t line_number() const { return line_number_; }

 private:
  LineReader(std::string path, OpenedFile opened, int64_t max_line_bytes);
  // OK when the file is as it was opened and all of it has been read.
  absl::Status CheckUnchanged() const;

  std::string path_;
  int fd_ = -1;
  OpenedFile opened_;
  int64_t bytes_read_ = 0;  // of the file (compressed, for a .zst file)
  int64_t max_line_bytes_ = 0;
  int64_t line_number_ = 0;
  struct Zstd;  // the decompression stream of a .zst file
  // Up to `size` more bytes of text into `out`; 0 at the end of the file.
  absl::StatusOr<size_t> ReadMore(char* out, size_t size);

  std::unique_ptr<Zstd> zstd_;
  std::string buffer_;  // read; the lines from begin_ on not yet returned
  size_t begin_ = 0;
  bool eof_ = false;
};

}  // namespace ballast

#endif  // BALLAST_COMMON_REGULAR_FILE_H_
