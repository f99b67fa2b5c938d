#include "common/regular_file.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"

namespace ballast {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The kernel's pseudo file systems whose "regular" files it makes up on each
// read: their size says nothing (0 for most), and a read may fail
// (/proc/self/mem: EIO) or block (/proc/kmsg). No spec's file lives there.
const char* PseudoFileSystemOf(int fd) {
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return nullptr;
  switch (fs.f_type) {
    case PROC_SUPER_MAGIC:
      return "proc";
    case SYSFS_MAGIC:
      return "sysfs";
    case DEBUGFS_MAGIC:
      return "debugfs";
    case TRACEFS_MAGIC:
      return "tracefs";
    case SECURITYFS_MAGIC:
      return "securityfs";
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
      return "cgroup";
    case PSTOREFS_MAGIC:
      return "pstore";
    case EFIVARFS_MAGIC:
      return "efivarfs";
    case BPF_FS_MAGIC:
      return "bpf";
    default:
      return nullptr;
  }
}

namespace fs = std::filesystem;

// The roots of ConfineOpensBeneath, each as given and with its symlinks
// resolved, and as given for messages.
struct Confinement {
  absl::Mutex mu;
  std::vector<fs::path> roots ABSL_GUARDED_BY(mu);
  std::vector<std::string> given ABSL_GUARDED_BY(mu);
};

Confinement& TheConfinement() {
  static Confinement* const confinement = new Confinement;
  return *confinement;
}

bool IsUnderAny(const fs::path& path, const std::vector<fs::path>& roots) {
  return std::any_of(roots.begin(), roots.end(),
                     [&](const fs::path& root) { return IsPathUnder(path, root); });
}

// OK unless `path` is under a root and `fd`, opened from it, is a file
// outside them.
absl::Status CheckConfined(const std::string& path, int fd) {
  Confinement& c = TheConfinement();
  absl::ReaderMutexLock lock(&c.mu);
  if (c.roots.empty() || !IsUnderAny(fs::path(path).lexically_normal(), c.roots)) {
    return absl::OkStatus();
  }
  std::error_code ec;
  const fs::path opened = fs::read_symlink(absl::StrCat("/proc/self/fd/", fd), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot tell where ", path, " leads, so it is not read (/proc/self/fd: ", ec.message(),
        "); the path roots need /proc mounted"));
  }
  if (IsUnderAny(opened, c.roots)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      path, " leads to ", opened.string(), ", outside the path roots ",
      absl::StrJoin(c.given, ", "),
      ": a symlink on the way points out of them (it may have changed after the job's paths "
      "were checked)"));
}

// EIO, EACCES (a security module may refuse at read): a file that cannot be
// read is a bad input, which no retry fixes.
absl::Status CannotRead(const std::string& path, int error) {
  return absl::InvalidArgumentError(absl::StrCat("cannot read ", path, ": ", strerror(error)));
}

}  // namespace

bool IsPathUnder(const std::filesystem::path& path, const std::filesystem::path& root) {
  return std::mismatch(root.begin(), root.end(), path.begin(), path.end()).first == root.end();
}

void ConfineOpensBeneath(const std::vector<std::string>& given) {
  std::vector<fs::path> roots;
  for (const std::string& root : given) {
    roots.push_back(fs::path(root).lexically_normal());
    std::error_code ec;
    const fs::path resolved = fs::weakly_canonical(root, ec);
    if (!ec && resolved != roots.back()) roots.push_back(resolved);
  }
  Confinement& c = TheConfinement();
  absl::MutexLock lock(&c.mu);
  c.roots = std::move(roots);
  c.given = given;
}

absl::StatusOr<OpenedFile> OpenRegularFile(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, and
  // is refused below; reads of a regular file never block anyway.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return absl::InvalidArgumentError(absl::StrCat("cannot open ", path, ": ", strerror(errno)));
  }
  if (absl::Status s = CheckConfined(path, fd); !s.ok()) {
    close(fd);
    return s;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("cannot stat ", path, ": ", strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", KindOf(st.st_mode), "; a regular file is needed"));
  }
  if (const char* pseudo = PseudoFileSystemOf(fd); pseudo != nullptr) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a file of the kernel's ", pseudo,
                     " file system, made up as it is read; a regular file on a disk is needed"));
  }
  return OpenedFile{fd, static_cast<int64_t>(st.st_size), st.st_mtim};
}

absl::Status CheckRegularFile(const std::string& path) {
  absl::StatusOr<OpenedFile> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  close(opened->fd);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<OpenedFile> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  const int fd = opened->fd;
  const int64_t size = opened->size;
  if (size > max_bytes) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is ", size, " bytes; at most ", max_bytes, " are expected of it"));
  }
  std::string text(static_cast<size_t>(size), '\0');
  int64_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, text.data() + done, static_cast<size_t>(size - done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return CannotRead(path, error);
    }
    if (n == 0) break;  // the file shrank: keep what there is
    done += n;
  }
  close(fd);
  text.resize(static_cast<size_t>(done));
  return text;
}

struct LineReader::Zstd {
  Zstd() : stream(ZSTD_createDStream()) {}
  ~Zstd() { ZSTD_freeDStream(stream); }
  ZSTD_DStream* stream;
  std::string input = std::string(ZSTD_DStreamInSize(), '\0');
  ZSTD_inBuffer in{input.data(), 0, 0};
  bool input_done = false;
  size_t frame_left = 0;  // ZSTD_decompressStream's hint: 0 once a frame is complete
};

absl::StatusOr<LineReader> LineReader::Open(const std::string& path, int64_t max_line_bytes) {
  absl::StatusOr<OpenedFile> opened = OpenRegularFile(path);
  if (!opened.ok()) return opened.status();
  LineReader reader(path, *opened, max_line_bytes);
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".zst") == 0) {
    reader.zstd_ = std::make_unique<Zstd>();
  }
  return reader;
}

absl::StatusOr<size_t> LineReader::ReadMore(char* out, size_t size) {
  for (;;) {
    if (!zstd_ || zstd_->in.pos == zstd_->in.size) {
      if (zstd_ && zstd_->input_done) {
        if (zstd_->frame_left != 0) {
          return absl::InvalidArgumentError(
              absl::StrCat(path_, ": the zstd data ends in the middle of a frame"));
        }
        return 0;
      }
      char* target = zstd_ ? zstd_->input.data() : out;
      const size_t capacity = std::min<size_t>(zstd_ ? zstd_->input.size() : size,
                                               static_cast<size_t>(opened_.size - bytes_read_));
      ssize_t n = 0;
      if (capacity > 0) {
        n = read(fd_, target, capacity);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return CannotRead(path_, errno);
        bytes_read_ += n;
      }
      if (n == 0) {
        if (absl::Status s = CheckUnchanged(); !s.ok()) return s;
      }
      if (!zstd_) return static_cast<size_t>(n);
      zstd_->in = {zstd_->input.data(), static_cast<size_t>(n), 0};
      zstd_->input_done = n == 0;
      continue;
    }
    ZSTD_outBuffer o{out, size, 0};
    const size_t hint = ZSTD_decompressStream(zstd_->stream, &o, &zstd_->in);
    if (ZSTD_isError(hint)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": corrupt zstd data: ", ZSTD_getErrorName(hint)));
    }
    zstd_->frame_left = hint;
    if (o.pos > 0) return o.pos;
  }
}

absl::Status LineReader::CheckUnchanged() const {
  struct stat st {};
  if (fstat(fd_, &st) != 0) return CannotRead(path_, errno);
  const bool same_time =
      st.st_mtim.tv_sec == opened_.mtime.tv_sec && st.st_mtim.tv_nsec == opened_.mtime.tv_nsec;
  if (bytes_read_ == opened_.size && st.st_size == opened_.size && same_time) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path_, " changed while it was read: ", opened_.size, " bytes when it was opened, ",
      bytes_read_ < opened_.size ? absl::StrCat("only ", bytes_read_, " could be read, ") : "",
      st.st_size, " now", same_time ? "" : ", modified since",
      "; a data file must stay as it is until the job has read it"));
}

LineReader::LineReader(std::string path, OpenedFile opened, int64_t max_line_bytes)
    : path_(std::move(path)), fd_(opened.fd), opened_(opened), max_line_bytes_(max_line_bytes) {}

LineReader::LineReader(LineReader&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      opened_(other.opened_),
      bytes_read_(other.bytes_read_),
      max_line_bytes_(other.max_line_bytes_),
      line_number_(other.line_number_),
      zstd_(std::move(other.zstd_)),
      buffer_(std::move(other.buffer_)),
      begin_(other.begin_),
      eof_(other.eof_) {}

LineReader& LineReader::operator=(LineReader&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    opened_ = other.opened_;
    bytes_read_ = other.bytes_read_;
    max_line_bytes_ = other.max_line_bytes_;
    line_number_ = other.line_number_;
    zstd_ = std::move(other.zstd_);
    buffer_ = std::move(other.buffer_);
    begin_ = other.begin_;
    eof_ = other.eof_;
  }
  return *this;
}

LineReader::~LineReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<bool> LineReader::Next(std::string* line) {
  constexpr size_t kChunk = 1 << 16;
  size_t searched = begin_;
  for (;;) {
    const size_t newline = buffer_.find('\n', searched);
    if (newline != std::string::npos) {
      ++line_number_;
      if (static_cast<int64_t>(newline - begin_) > max_line_bytes_) {
        return absl::InvalidArgumentError(
            absl::StrCat(path_, ":", line_number_, ": the line is longer than ", max_line_bytes_,
                         " bytes, more than any valid record can be"));
      }
      line->assign(buffer_, begin_, newline - begin_);
      begin_ = newline + 1;
      return true;
    }
    if (static_cast<int64_t>(buffer_.size() - begin_) > max_line_bytes_) {
      ++line_number_;
      return absl::InvalidArgumentError(absl::StrCat(path_, ":", line_number_,
                                                     ": the line is longer than ", max_line_bytes_,
                                                     " bytes, more than any valid record can be"));
    }
    if (eof_) {
      if (begin_ == buffer_.size()) return false;
      ++line_number_;
      line->assign(buffer_, begin_, std::string::npos);
      begin_ = buffer_.size();
      return true;
    }
    // The lines returned go before reading on: one move per chunk, not one
    // per line.
    buffer_.erase(0, begin_);
    begin_ = 0;
    searched = buffer_.size();
    buffer_.resize(searched + kChunk);
    absl::StatusOr<size_t> n = ReadMore(buffer_.data() + searched, kChunk);
    buffer_.resize(searched + (n.ok() ? *n : 0));
    if (!n.ok()) return n.status();
    if (*n == 0) eof_ = true;
  }
}

}  // namespace ballast
