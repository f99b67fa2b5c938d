// DelayInjection: the progress watchdog's faults, for its tests and demos
// (docs/reliability.md, "Watchdog"): a rank that hangs inside a step, and a
// rank slower than its peers in every step. With nothing asked for, InStep
// is a no-op, and a real run never asks.
//
// They come from ballast-train's environment, not the spec: they are faults
// of one process on one host, not of the job (and a worker passes its
// environment to its ranks, so a test slows the ranks of one worker):
//   BALLAST_INJECT_HANG=RANK:STEP:SECONDS  rank RANK sleeps SECONDS inside
//       step STEP, in the job's first attempt only (the restart the watchdog
//       makes resumes past it), or in a standalone run
//   BALLAST_INJECT_SLOW=RANK:SECONDS       rank RANK sleeps SECONDS inside
//       every step
// Either sleep is in the step's data phase, before its first collective.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_DELAY_INJECTION_H_
#define BALLAST_WORKER_TRAIN_TRAINER_DELAY_INJECTION_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::train {

class DelayInjection {
 public:
  // Nothing injected.
  DelayInjection() = default;
  // What the environment asks of rank `rank` in attempt `attempt` (0:
  // standalone). INVALID_ARGUMENT naming the variable when one does not
  // parse.
  static absl::StatusOr<DelayInjection> FromEnvironment(int rank, int32_t attempt);

  // What is asked, in words, for the run's log; empty when nothing.
  std::string Describe() const;

  // Sleeps as asked for step `step` (1-based).
  void InStep(int64_t step) const;

 private:
  int64_t hang_step_ = 0;  // 0: none
  std::chrono::milliseconds hang_{0};
  std::chrono::milliseconds slow_{0};
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_DELAY_INJECTION_H_
