// Guard: decides, once per optimizer step and after the gradients are
// reduced, whether the step may reach the weights.
//
//   apply     the step is healthy: clip and update
//   skip      a bad step: the loss or grad_norm is not finite, or no rank had
//             a supervised token. The update is dropped; the step still
//             counts (the step counter, the LR schedule and the data cursor
//             move on, so the step's batch is not retried)
//   roll back max_consecutive_bad bad steps in a row, a spike, or a
//             collapse: the trainer goes back to the newest good state from
//             before the trouble began (GuardVerdict::episode_start) and
//             past the data that led there, while the rollback budget lasts
//
// After a rollback the learning rate is cut to lr_cut of the schedule's and
// re-warmed linearly over rewarm_steps applied steps (LrScale).
//
// At the end of a run (TooFewApplied): a run that applied no step, or fewer
// than min_applied_fraction of its steps, fails with the causes of its
// skipped steps. A run shorter than max_consecutive_bad never meets the bad
// streak rule, and would otherwise export an adapter that never trained.
//
// Spike: the step's loss (or grad_norm) lies more than a threshold of robust
// standard deviations above the median of the last `spike_window` healthy
// steps, z = (x - median) / (1.4826 MAD), judged once the window is full.
// Collapse: `collapse_window` steps in a row whose loss stays below
// `collapse_loss`, or whose grad_norm stays within 1e-4 relative of one
// value; either means nothing is being learned, though every number is
// finite (DESIGN.md: a loss of exactly 0 with a constant grad_norm for 5,000
// steps).
// Router collapse (Mixture-of-Experts models), a trigger of its own:
// `collapse_window` steps in a row in which some MoE layer's k most loaded
// experts take more than `moe_collapse_share` of its routed (token, choice)
// pairs (MoeLayerStats::top_k_share, model/moe_step_stats.h, says why k and
// not fewer): the router sends (nearly) every token to the same k experts
// and the others stop learning. Like a collapse, it rolls back.
//
// The guard sees only global values (all ranks reduced), so every rank
// reaches the same verdict; the trainer still agrees on the most severe one
// across ranks.
//
// Thread-compatible. No LibTorch: it judges numbers.
#ifndef BALLAST_WORKER_TRAIN_GUARD_GUARD_H_
#define BALLAST_WORKER_TRAIN_GUARD_GUARD_H_

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "ballast/v1/job_spec.pb.h"
#include "common/spec_rules.h"
#include "worker/train/model/moe_step_stats.h"

namespace ballast::train {

// Ordered by severity: across ranks, the largest wins.
enum class GuardAction : int64_t { kApply = 0, kSkip = 1, kRollback = 2 };

// What re-running a bad step on the same state showed.
enum class RerunVerdict { kNotRerun, kTransient, kDeterministic };

// What made a step unhealthy.
enum class GuardTrigger {
  kNone,
  kNonFinite,
  kNoSupervision,
  kSpike,
  kCollapse,
  kRouterCollapse,
};

// The spec's guard section (proto/ballast/v1/job_spec.proto, GuardSpec),
// with the spec's defaults (common/spec_rules.h), so that a guard made here
// judges as a job's does.
struct GuardOptions {
  // Bad steps in a row after which the guard asks for a rollback; 0 never.
  int64_t max_consecutive_bad = SpecDefaultNumber("guard.max_consecutive_bad");
  // Rollbacks a run may take; the next one it asks for fails the job.
  int64_t max_rollbacks = SpecDefaultNumber("guard.max_rollbacks");
  int64_t spike_window = SpecDefaultNumber("guard.spike_window");
  // Robust z-scores above which a step is a spike; 0 off.
  double loss_spike_zscore = SpecDefaultNumber("guard.loss_spike_zscore");
  double grad_norm_spike_zscore = SpecDefaultNumber("guard.grad_norm_spike_zscore");
  // Steps in a row of a collapsed loss or a constant grad_norm; 0 off.
  int64_t collapse_window = SpecDefaultNumber("guard.collapse_window");
  double collapse_loss = SpecDefaultNumber("guard.collapse_loss");
  // The top-k share above which a MoE layer's step counts towards a router
  // collapse (over collapse_window steps); 0 off.
  double moe_collapse_share = SpecDefaultNumber("guard.moe_collapse_share");
  // The LR multiplier right after a rollback, and the applied steps over
  // which it rises back to 1 (0: it stays).
  double lr_cut = SpecDefaultNumber("guard.lr_cut");
  int64_t rewarm_steps = SpecDefaultNumber("guard.rewarm_steps");
  // The least share of a run's steps that must be applied for it to succeed.
  double min_applied_fraction = SpecDefaultNumber("guard.min_applied_fraction");
};

// The options of a spec's guard section, field by field.
GuardOptions GuardOptionsFromSpec(const v1::GuardSpec& spec);

// What a step measured, after the reductions over micro-batches and ranks.
struct StepHealth {
  int64_t step = 0;  // 1-based: the step being judged
  double loss = 0;   // sum of token losses / supervised tokens
  double grad_norm = 0;
  // Supervised tokens of the step over all ranks; 0 leaves nothing to judge
  // the loss by.
  int64_t supervised_tokens = 1;
  // The first trainable tensor (in ParamStore order) whose gradient holds a
  // NaN or an infinity, and the lowest rank where it does; empty and -1
  // when none does.
  std::string first_nonfinite;
  int nonfinite_rank = -1;
  // A Mixture-of-Experts model's routing over the step; absent for a dense one.
  std::optional<MoeStepStats> moe;
};

struct GuardVerdict {
  GuardAction action = GuardAction::kApply;
  GuardTrigger trigger = GuardTrigger::kNone;
  // Why the step was not applied, naming the value or tensor; empty for kApply.
  std::string reason;
  // For kRollback when the budget is spent: the job cannot recover by itself.
  bool budget_spent = false;
  // Set by the trainer when it re-ran the step.
  RerunVerdict rerun = RerunVerdict::kNotRerun;
  // For kRollback: the first step of the trouble (of the bad streak, the
  // spike, or the collapsed run); the state to go back to must be older.
  int64_t episode_start = 0;
};

// "non_finite", "no_supervision", "spike", "collapse", "router_collapse"; ""
// for kNone. The names of events and metrics.
const char* TriggerName(GuardTrigger trigger);

class Guard {
 public:
  explicit Guard(GuardOptions options = {});

  // The verdict on one step; counts the bad streak.
  GuardVerdict Judge(const StepHealth& health);
  // Records that the trainer acted on `verdict` (its action the one the
  // ranks agreed, which may be more severe than this rank's own), with the
  // health it judged: an applied step joins the spike window, a skipped one
  // is counted under its trigger.
  void Acted(const GuardVerdict& verdict, const StepHealth& health);

  // Why a run of `steps` steps of which `applied` were applied must fail:
  // none applied, or fewer than min_applied_fraction of them. The reason
  // names the causes of the steps this guard saw skipped ("no step was
  // applied: every step had no supervised tokens"); empty when the run may
  // succeed.
  std::string TooFewApplied(int64_t applied, int64_t steps) const;
  // The trigger that skipped the most steps this guard saw; kNone when none
  // was skipped.
  GuardTrigger MostSkippedBy() const;

  int64_t consecutive_bad() const { return consecutive_bad_; }
  int64_t rollbacks() const { return rollbacks_; }
  // Applied steps in a row since the last step that was not (a state saved
  // before them is good once there are enough of them).
  int64_t clean_steps() const { return clean_steps_; }
  // What multiplies the scheduled learning rate now: 1 before the first
  // rollback; lr_cut right after one, rising linearly to 1 over rewarm_steps.
  double LrScale() const;

 private:
  // The verdict's action and reason for a bad or alarming step that began
  // at `episode_start`.
  void Escalate(GuardVerdict* verdict, bool roll_back_now, int64_t episode_start) const;
  std::string Spike(const std::deque<double>& window, double value, double zscore,
                    const char* what) const;
  // The first MoE layer of `health` whose top-k share passes
  // moe_collapse_share, or nullptr (none, a dense model, or the check off).
  const MoeLayerStats* CollapsedLayer(const StepHealth& health) const;

  GuardOptions options_;
  int64_t consecutive_bad_ = 0;
  int64_t rollbacks_ = 0;
  int64_t clean_steps_ = 0;
  int64_t applied_since_rollback_ = 0;
  // The last spike_window applied steps' values.
  std::deque<double> losses_, grad_norms_;
  // Collapse: applied steps in a row with a loss below collapse_loss, and
  // with a grad_norm near pinned_grad_norm_.
  int64_t low_loss_run_ = 0;
  int64_t pinned_run_ = 0;
  double pinned_grad_norm_ = 0;
  // Applied steps in a row with a collapsed MoE layer (CollapsedLayer).
  int64_t router_collapse_run_ = 0;
  // Skipped steps by trigger (indexed by GuardTrigger).
  std::array<int64_t, static_cast<size_t>(GuardTrigger::kRouterCollapse) + 1> skipped_{};
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_GUARD_GUARD_H_
