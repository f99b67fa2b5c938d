// StepPhase: where this rank is within a training step, for the progress
// watchdog (docs/reliability.md, "Watchdog"): reading data, the forward or
// backward of a decoder layer, inside which collective (and its sequence
// number), the optimizer, a checkpoint, an evaluation or the export.
//
// The training code marks each move (a few per layer per step); nothing is
// sent from here. The rank's channel to its worker reads the phase from its
// own thread and reports one that has held for a while, so a step that moves
// on sends nothing, and a rank stuck anywhere, whatever its training thread
// is blocked in, says where (worker/train/rank/agent_channel.h). A mark costs
// an uncontended lock and a clock read.
//
// There is one per process: a rank is a process, and the marks come from
// layers (the sharded model, the collectives) that share no object but this.
// It lives with the collectives, the lowest component that marks it.
//
// Thread-safe: autograd may run a backward on a thread of its own.
#ifndef BALLAST_WORKER_TRAIN_COLLECTIVES_STEP_PHASE_H_
#define BALLAST_WORKER_TRAIN_COLLECTIVES_STEP_PHASE_H_

#include <chrono>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace ballast::train {

class StepPhase {
 public:
  // The names are RankPhase.phase's (proto/ballast/v1/job.proto).
  enum class Kind {
    kIdle,
    kData,
    kForward,
    kBackward,
    kCollective,
    kOptimizer,
    kCheckpoint,
    kEval,
    kExport
  };
  static absl::string_view Name(Kind kind);

  struct Snapshot {
    int64_t step = 0;
    Kind kind = Kind::kIdle;
    // The decoder layer, or -1 outside one.
    int32_t layer = -1;
    // Inside a collective: its kind (a string literal) and sequence number.
    absl::string_view collective;
    int64_t collective_seq = 0;
    // When the phase was entered, Unix ms.
    int64_t since_ms = 0;
    // Grows with every mark: a reader tells a phase it has seen from a new
    // one, even one of the same kind.
    uint64_t version = 0;
  };

  // This process's.
  static StepPhase& OfThisRank();

  StepPhase() = default;
  StepPhase(const StepPhase&) = delete;
  StepPhase& operator=(const StepPhase&) = delete;

  // Step `step` (1-based) begins with its data.
  void BeginStep(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // Enters `kind` (not kCollective), in `layer` or outside any (-1).
  void Enter(Kind kind, int32_t layer = -1) ABSL_LOCKS_EXCLUDED(mu_);

  // Enters collective `name` (a string literal), numbered `seq`, keeping the
  // step and the layer; returns the phase it left, for LeaveCollective.
  Snapshot EnterCollective(absl::string_view name, int64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Back to `left` (its own start time kept), adding the time spent inside
  // to collective_ms().
  void LeaveCollective(const Snapshot& left) ABSL_LOCKS_EXCLUDED(mu_);

  Snapshot Read() const ABSL_LOCKS_EXCLUDED(mu_);
  // Time spent inside collectives since the process started, in ms: what a
  // step waited for its peers (and moved data), which the straggler watch
  // takes out of the step's time.
  double collective_ms() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void SetLocked(Kind kind, int32_t layer, absl::string_view collective, int64_t seq,
                 int64_t since_ms) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Snapshot now_ ABSL_GUARDED_BY(mu_);
  // When the collective now running was entered; a step's many small
  // collectives need better than since_ms's milliseconds.
  std::chrono::steady_clock::time_point collective_start_ ABSL_GUARDED_BY(mu_);
  double collective_ms_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_COLLECTIVES_STEP_PHASE_H_
