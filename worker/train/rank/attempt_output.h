// AttemptOutput: keeps one attempt of a job out of the job's output folder
// until it commits, so that a superseded rank (a frozen worker's, say) can
// never add to what the current attempt wrote.
//
// Layout of OUT, the job's output_dir, under a coordinator:
//   metrics.jsonl, checkpoints/step-*/, adapter/ or model/   committed output
//   tensorboard/     the attempts' TensorBoard event files, committed too
//   attempts/N/      attempt N's own folder: the trainer's out_dir
//   attempt          the newest attempt that claimed OUT ("7\n")
//   .commit.lock     flock'ed around every claim and commit
// A standalone run (no attempt) writes straight into OUT, as README says.
//
// Claim (at start, under the lock): refuses when a newer attempt holds OUT,
// records N, removes older attempts' folders, applies a rollback to the
// committed checkpoints (the newer ones go), and seeds attempts/N with the
// committed metrics.jsonl and, hard-linked, the newest committed checkpoint,
// so the trainer resumes there as if attempts/N were all of OUT.
//
// Each commit takes the lock and first checks that OUT is still this
// attempt's; if a newer attempt has claimed it, the commit writes nothing
// and returns ABORTED, and so does every later one. A claim therefore splits
// time in two: every commit of an older attempt lands before it, or never.
//
// Not thread-safe: the training thread uses it. Processes on one machine
// (or a file system with working flock) exclude each other.
#ifndef BALLAST_WORKER_TRAIN_RANK_ATTEMPT_OUTPUT_H_
#define BALLAST_WORKER_TRAIN_RANK_ATTEMPT_OUTPUT_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ballast::train {

class AttemptOutput {
 public:
  // Claims `out_dir` for `attempt` (>= 1) and prepares attempts/N (see
  // above). `resume_at_or_before` is TrainerOptions'.
  // ABORTED names the newer attempt that holds out_dir; DEADLINE_EXCEEDED
  // when the lock stays taken for 30 s; INTERNAL names a file that cannot
  // be written.
  static absl::StatusOr<std::unique_ptr<AttemptOutput>> Claim(
      const std::string& out_dir, int32_t attempt, std::optional<int64_t> resume_at_or_before);
  ~AttemptOutput();
  // attempts/N of `out_dir`: where every rank of attempt N writes.
  static std::string DirFor(const std::string& out_dir, int32_t attempt);
  AttemptOutput(const AttemptOutput&) = delete;
  AttemptOutput& operator=(const AttemptOutput&) = delete;

  // attempts/N: where the trainer writes.
  const std::string& dir() const { return dir_; }

  // Publishes the whole lines the trainer has added to dir()/metrics.jsonl
  // since the last call. The first call replaces OUT/metrics.jsonl (the
  // trainer has cut the lines past its checkpoint); later ones append.
  absl::Status CommitMetrics();
  // Publishes the records the trainer has added to each TensorBoard event
  // file in dir()/tensorboard since the last call to the file of the same
  // name in OUT/tensorboard (trainer/tensorboard_log.h: each process writes
  // a file of its own, which only grows). OK when there is none.
  absl::Status CommitTensorBoard();

  // Moves a checkpoint folder the trainer saved under dir()/checkpoints to
  // OUT/checkpoints (replacing one of the same step) and returns its new path.
  absl::StatusOr<std::string> CommitCheckpoint(const std::string& saved_dir);

  // Moves dir()/adapter or dir()/model over OUT's, then removes dir().
  // Returns the committed folder.
  absl::StatusOr<std::string> CommitExport();

  // Removes dir() (everything worth keeping is committed). Commits after it
  // fail.
  void Discard();

 private:
  AttemptOutput(std::string out_dir, int32_t attempt, int lock_fd);
  // The claim's work, under the lock.
  absl::Status Prepare(std::optional<int64_t> resume_at_or_before);
  // Takes the lock, waiting up to 30 s.
  absl::Status Lock();
  // Lock, then checks that OUT is still this attempt's (ABORTED otherwise,
  // unlocked). The caller must Unlock after an OK.
  absl::Status LockCurrent();
  void Unlock();

  const std::string out_dir_;
  const std::string dir_;
  const int32_t attempt_;
  const int lock_fd_;
  // Bytes of dir()/metrics.jsonl published so far; -1 before the first commit.
  int64_t committed_bytes_ = -1;
  // The file those bytes came from.
  ino_t committed_inode_ = 0;
  // Bytes of each dir()/tensorboard file published so far, by file name.
  std::map<std::string, int64_t> committed_tensorboard_bytes_;
  bool discarded_ = false;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_ATTEMPT_OUTPUT_H_
