// RankProcess: one child process (a ballast-train rank) in its own process
// group, with stdout and stderr appended to a log file, reaped by a thread of
// its own, and stopped with SIGTERM then SIGKILL.
//
// Thread-safe: Stop, Exited and WaitForExit may be called from any thread.
#ifndef BALLAST_WORKER_AGENT_RANK_PROCESS_H_
#define BALLAST_WORKER_AGENT_RANK_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rank_event_bound.h"

namespace ballast::agent {

// How a process ended.
struct ProcessExit {
  // The exit code, or 128 + the signal number that killed it.
  int exit_code = 0;
  // True when Stop was called before it exited.
  bool stopped = false;
  // The last bytes (at most kLogTailBytes, whole lines where possible, valid
  // UTF-8) that this process appended to its log.
  std::string log_tail;
};

struct SpawnOptions {
  // Path of the executable; argv[0] is set to it.
  std::string binary;
  std::vector<std::string> args;
  // Variables set (or replaced) on top of the worker's own environment.
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr are appended here; its folder must exist.
  std::string log_path;
  // Called once, on the reaper thread, after the process has exited and been
  // reaped. It must not destroy the RankProcess.
  std::function<void(const ProcessExit&)> on_exit;
};

class RankProcess {
 public:
  static constexpr size_t kLogTailBytes = kMaxStderrTailBytes;

  // Starts the process (posix_spawn: nothing runs in the child between fork
  // and exec) in a new process group, with default signal dispositions, an
  // empty signal mask, stdin from /dev/null and no other inherited fds.
  // INTERNAL or NOT_FOUND names the binary or log file when it cannot start.
  static absl::StatusOr<std::unique_ptr<RankProcess>> Spawn(SpawnOptions options);

  // Kills the process group with SIGKILL if it still runs, and joins the
  // threads. Blocks until the process is reaped and on_exit has returned.
  ~RankProcess();

  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  pid_t pid() const { return pid_; }

  // Sends SIGTERM to the process group, and SIGKILL when it has not exited
  // `grace` later. Returns at once. Later calls (and KillAfter) do nothing.
  void Stop(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);
  // Stop for a process already asked to stop another way (over its socket):
  // no SIGTERM now, SIGKILL when it has not exited `grace` later; the exit
  // counts as stopped. Later calls (and Stop) do nothing.
  void KillAfter(absl::Duration grace) ABSL_LOCKS_EXCLUDED(mu_);

  // True once the process has exited (on_exit may still be running).
  bool Exited() const ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` for the exit; the exit when it happened.
  std::optional<ProcessExit> WaitForExit(absl::Duration timeout) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RankProcess(pid_t pid, SpawnOptions options, int64_t log_start);
  void StopWith(absl::Duration grace, bool sigterm) ABSL_LOCKS_EXCLUDED(mu_);
  void ReaperLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void KillerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool ExitedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return exited_ || stop_requested_;
  }
  bool HasExit() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exit_.has_value(); }
  std::string ReadLogTail() const;

  const pid_t pid_;
  const SpawnOptions options_;
  // Size of the log before this process wrote to it: the tail never reaches
  // into an earlier attempt's output.
  const int64_t log_start_;

  mutable absl::Mutex mu_;
  bool exited_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool destroying_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time kill_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::optional<ProcessExit> exit_ ABSL_GUARDED_BY(mu_);

  std::thread reaper_;
  std::thread killer_;
};

// `text` with every byte that is not part of valid UTF-8 replaced by '?', so
// that it fits a proto3 string field.
std::string SanitizeUtf8(std::string_view text);

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_RANK_PROCESS_H_
