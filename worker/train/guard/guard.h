// Guard: decides, once per optimizer step and after the gradients are
// reduced, whether the step may reach the weights.
//
//   apply     the step is healthy: clip and update
//   skip      the loss or grad_norm is not finite: the update is dropped,
//             the step still counts (the step counter, the LR schedule and the
//             data cursor move on, so the step's batch is not retried)
//   roll back max_consecutive_bad skipped steps in a row: the trainer goes
//             back to its newest checkpoint, while the rollback budget lasts
//
// A step without supervised tokens has no loss to judge: the trainer skips it
// before the forward, and the guard does not count it as bad. The guard sees
// only global values (all ranks reduced), so every rank reaches the same
// verdict; the trainer still agrees on the most severe one across ranks.
//
// Thread-compatible. No LibTorch: it judges numbers.
#ifndef BALLAST_WORKER_TRAIN_GUARD_GUARD_H_
#define BALLAST_WORKER_TRAIN_GUARD_GUARD_H_

#include <cstdint>
#include <string>

namespace ballast::train {

// Ordered by severity: across ranks, the largest wins.
enum class GuardAction : int64_t { kApply = 0, kSkip = 1, kRollback = 2 };

struct GuardOptions {
  // Skipped steps in a row after which the guard asks for a rollback; 0
  // never asks (every bad step is skipped, as today's frameworks do).
  int64_t max_consecutive_bad = 0;
  // Rollbacks a run may take; one more bad streak after that fails the job.
  int64_t max_rollbacks = 3;
};

// What a step measured, after the reductions over micro-batches and ranks.
struct StepHealth {
  int64_t step = 0;  // 1-based: the step being judged
  double loss = 0;   // sum of token losses / supervised tokens
  double grad_norm = 0;
  // The first trainable tensor (in ParamStore order) whose gradient holds a
  // NaN or an infinity on this rank; empty when none does.
  std::string first_nonfinite;
};

struct GuardVerdict {
  GuardAction action = GuardAction::kApply;
  // Why the step was not applied, naming the value or tensor; empty for kApply.
  std::string reason;
  // For kRollback when the budget is spent: the job cannot recover by itself.
  bool budget_spent = false;
};

class Guard {
 public:
  explicit Guard(GuardOptions options = {});

  // The verdict on one step; counts the bad streak and the rollbacks taken.
  GuardVerdict Judge(const StepHealth& health);
  // Records that the trainer acted on `action` after the ranks agreed (an
  // agreed action may be more severe than this rank's own verdict).
  void Acted(GuardAction action);

  int64_t consecutive_bad() const { return consecutive_bad_; }
  int64_t rollbacks() const { return rollbacks_; }

 private:
  GuardOptions options_;
  int64_t consecutive_bad_ = 0;
  int64_t rollbacks_ = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_GUARD_GUARD_H_
