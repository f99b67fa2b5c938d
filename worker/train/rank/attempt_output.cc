#include "worker/train/rank/attempt_output.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/io/file_tree.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

constexpr char kClaimFile[] = "attempt";
constexpr char kLockFile[] = ".commit.lock";
constexpr char kAttemptsDir[] = "attempts";
constexpr char kMetrics[] = "metrics.jsonl";
constexpr char kCheckpoints[] = "checkpoints";
constexpr char kTensorBoard[] = "tensorboard";
// Claims and commits hold the lock for a rename or a short append; a holder
// this slow is stuck (a frozen process on a shared file system).
constexpr std::chrono::seconds kLockWait{30};

// The attempt recorded in OUT/attempt; 0 when none has claimed OUT.
int32_t ClaimedAttempt(const fs::path& out) {
  std::ifstream in(out / kClaimFile);
  std::string text;
  std::getline(in, text);
  int32_t attempt = 0;
  return absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &attempt) ? attempt : 0;
}

// Readers see the old contents or the new, never a part.
absl::Status WriteAtomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

// Replaces `to` with the folder `from`. The old `to` is first renamed to a
// hidden .tmp name (which LatestCheckpoint clears), so `to` is always whole.
absl::Status ReplaceFolder(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  const fs::path old = to.parent_path() / absl::StrCat(".", to.filename().string(), ".old.tmp");
  if (absl::Status s = RemoveTree(old.string()); !s.ok()) return s;
  if (fs::exists(to, ec)) fs::rename(to, old, ec);
  if (!ec) fs::rename(from, to, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot move ", from.string(), " to ", to.string(), ": ", ec.message()));
  }
  return RemoveTree(old.string());
}

// A byte copy through streams: libtorch.so exports its own std::filesystem
// copy functions (see file_tree.h), which this binary must not call.
absl::Status CopyFile(const fs::path& from, const fs::path& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  out.close();
  if (!in || !out) {
    return absl::InternalError(absl::StrCat("cannot copy ", from.string(), " to ", to.string()));
  }
  return absl::OkStatus();
}

// A copy of a checkpoint folder for the trainer to resume from: hard links,
// since it only reads them, or byte copies where the file system refuses.
absl::Status LinkTree(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", to.string()));
  for (const auto& entry : fs::directory_iterator(from, ec)) {
    const fs::path target = to / entry.path().filename();
    absl::Status s;
    if (entry.is_directory()) {
      s = LinkTree(entry.path(), target);
    } else if (link(entry.path().c_str(), target.c_str()) != 0) {
      s = CopyFile(entry.path(), target);
    }
    if (!s.ok()) return s;
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", from.string()));
  return absl::OkStatus();
}

// The bytes of `path` from byte `offset` on.
std::string ReadFrom(const fs::path& path, int64_t offset) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(offset);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The whole lines of `path` from byte `offset` on (a line still being
// written waits for the next call).
std::string ReadLinesFrom(const fs::path& path, int64_t offset) {
  std::string text = ReadFrom(path, offset);
  const size_t end = text.rfind('\n');
  text.resize(end == std::string::npos ? 0 : end + 1);
  return text;
}

absl::Status Append(const fs::path& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot open ", path.string(), ": ", strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      return absl::InternalError(
          absl::StrCat("cannot append to ", path.string(), ": ", strerror(err)));
    }
    done += n;
  }
  close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<AttemptOutput>> AttemptOutput::Claim(
    const std::string& out_dir, int32_t attempt, std::optional<int64_t> resume_at_or_before) {
  if (attempt < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--attempt ", attempt, "; allowed 1 or more"));
  }
  const fs::path out(out_dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  const int fd = open((out / kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open ", (out / kLockFile).string(), ": ", strerror(errno)));
  }
  std::unique_ptr<AttemptOutput> self(new AttemptOutput(out_dir, attempt, fd));
  if (absl::Status s = self->Lock(); !s.ok()) return s;
  absl::Status s = self->Prepare(resume_at_or_before);
  self->Unlock();
  if (!s.ok()) return s;
  return self;
}

std::string AttemptOutput::DirFor(const std::string& out_dir, int32_t attempt) {
  return (fs::path(out_dir) / kAttemptsDir / absl::StrCat(attempt)).string();
}

AttemptOutput::AttemptOutput(std::string out_dir, int32_t attempt, int lock_fd)
    : out_dir_(std::move(out_dir)),
      dir_(DirFor(out_dir_, attempt)),
      attempt_(attempt),
      lock_fd_(lock_fd) {}

AttemptOutput::~AttemptOutput() { close(lock_fd_); }

absl::Status AttemptOutput::Prepare(std::optional<int64_t> resume_at_or_before) {
  const fs::path out(out_dir_);
  const int32_t holder = ClaimedAttempt(out);
  if (holder > attempt_) {
    return absl::AbortedError(absl::StrCat("attempt ", holder, " of this job holds ", out_dir_,
                                           "; attempt ", attempt_, " is superseded"));
  }
  if (absl::Status s = WriteAtomically(out / kClaimFile, absl::StrCat(attempt_, "\n")); !s.ok()) {
    return s;
  }
  // Older attempts' folders hold nothing committed; a rank of one that still
  // runs loses its files, and its commits are refused from now on.
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(out / kAttemptsDir, ec)) {
    stale.push_back(entry.path());
  }
  for (const fs::path& path : stale) {
    if (absl::Status s = RemoveTree(path.string()); !s.ok()) return s;
  }
  fs::create_directories(fs::path(dir_) / kCheckpoints, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));

  // A rollback removes the newer committed checkpoints for good, as a
  // standalone run does, so that a later restart cannot jump forward again.
  const std::string committed = (out / kCheckpoints).string();
  std::optional<std::string> newest;
  if (resume_at_or_before) {
    absl::StatusOr<std::optional<std::string>> kept =
        KeepCheckpointsAtOrBefore(committed, *resume_at_or_before);
    if (!kept.ok()) return kept.status();
    newest = *kept;
  } else {
    newest = LatestCheckpoint(committed);
  }
  if (newest) {
    const fs::path from(*newest);
    if (absl::Status s = LinkTree(from, fs::path(dir_) / kCheckpoints / from.filename()); !s.ok()) {
      return s;
    }
  }
  if (fs::exists(out / kMetrics, ec)) return CopyFile(out / kMetrics, fs::path(dir_) / kMetrics);
  return absl::OkStatus();
}

absl::Status AttemptOutput::Lock() {
  const auto deadline = std::chrono::steady_clock::now() + kLockWait;
  for (;;) {
    if (flock(lock_fd_, LOCK_EX | LOCK_NB) == 0) return absl::OkStatus();
    if (errno != EWOULDBLOCK && errno != EINTR) {
      return absl::InternalError(
          absl::StrCat("cannot lock ", out_dir_, "/", kLockFile, ": ", strerror(errno)));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(out_dir_, "/", kLockFile, " stayed locked for ", kLockWait.count(), " s"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

absl::Status AttemptOutput::LockCurrent() {
  if (discarded_) return absl::FailedPreconditionError(absl::StrCat(dir_, " was discarded"));
  if (absl::Status s = Lock(); !s.ok()) return s;
  const int32_t holder = ClaimedAttempt(out_dir_);
  if (holder != attempt_) {
    Unlock();
    return absl::AbortedError(absl::StrCat("attempt ", holder, " of this job has taken over ",
                                           out_dir_, "; attempt ", attempt_,
                                           " stops without committing"));
  }
  return absl::OkStatus();
}

void AttemptOutput::Unlock() { flock(lock_fd_, LOCK_UN); }

absl::Status AttemptOutput::CommitMetrics() {
  if (absl::Status s = LockCurrent(); !s.ok()) return s;
  const fs::path theirs = fs::path(out_dir_) / kMetrics;
  // The trainer rewrites its log when it goes back to a step (a rollback),
  // as a new file: what was published is then published whole again.
  struct stat mine {};
  if (stat((fs::path(dir_) / kMetrics).c_str(), &mine) == 0 && mine.st_ino != committed_inode_) {
    committed_bytes_ = -1;
  }
  committed_inode_ = mine.st_ino;
  const std::string lines =
      ReadLinesFrom(fs::path(dir_) / kMetrics, std::max<int64_t>(committed_bytes_, 0));
  absl::Status s;
  if (committed_bytes_ < 0) {
    s = WriteAtomically(theirs, lines);
    if (s.ok()) committed_bytes_ = static_cast<int64_t>(lines.size());
  } else if (!lines.empty()) {
    s = Append(theirs, lines);
    if (s.ok()) committed_bytes_ += static_cast<int64_t>(lines.size());
  }
  Unlock();
  return s;
}

absl::Status AttemptOutput::CommitTensorBoard() {
  const fs::path mine = fs::path(dir_) / kTensorBoard;
  std::error_code ec;
  if (!fs::is_directory(mine, ec)) return absl::OkStatus();
  if (absl::Status s = LockCurrent(); !s.ok()) return s;
  const fs::path theirs = fs::path(out_dir_) / kTensorBoard;
  fs::create_directories(theirs, ec);
  absl::Status s;
  if (ec) {
    s = absl::InternalError(absl::StrCat("cannot create ", theirs.string(), ": ", ec.message()));
  }
  for (const auto& entry : fs::directory_iterator(mine, ec)) {
    if (!s.ok()) break;
    // The trainer appends whole records and has returned from the write, so
    // the bytes past the published ones are whole records too.
    int64_t& published = committed_tensorboard_bytes_[entry.path().filename().string()];
    const std::string records = ReadFrom(entry.path(), published);
    if (records.empty()) continue;
    s = Append(theirs / entry.path().filename(), records);
    if (s.ok()) published += static_cast<int64_t>(records.size());
  }
  Unlock();
  return s;
}

absl::StatusOr<std::string> AttemptOutput::CommitCheckpoint(const std::string& saved_dir) {
  if (absl::Status s = LockCurrent(); !s.ok()) return s;
  const fs::path to = fs::path(out_dir_) / kCheckpoints / fs::path(saved_dir).filename();
  std::error_code ec;
  fs::create_directories(to.parent_path(), ec);
  absl::Status s = ReplaceFolder(saved_dir, to);
  Unlock();
  if (!s.ok()) return s;
  return to.string();
}

absl::StatusOr<std::string> AttemptOutput::CommitExport() {
  for (const char* name : {"adapter", "model"}) {
    const fs::path from = fs::path(dir_) / name;
    std::error_code ec;
    if (!fs::is_directory(from, ec)) continue;
    if (absl::Status s = LockCurrent(); !s.ok()) return s;
    const fs::path to = fs::path(out_dir_) / name;
    absl::Status s = ReplaceFolder(from, to);
    Unlock();
    if (!s.ok()) return s;
    Discard();
    return to.string();
  }
  return absl::InternalError(absl::StrCat(dir_, " holds no adapter/ or model/ to commit"));
}

void AttemptOutput::Discard() {
  // Best effort: what is left is removed by the next attempt's claim.
  (void)RemoveTree(dir_);
  discarded_ = true;
}

}  // namespace ballast::train
