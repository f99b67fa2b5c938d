// Early stopping: judges each evaluation of the watched metric against the
// best one so far, decides when a run stops for want of improvement, and
// words why it stopped and which weights it exported.
//
// The rule (README "Validation and early stopping"): the first warmup_evals
// evaluations neither count against patience nor can be the best. After
// them, an evaluation improves when it beats the best by more than
// min_delta (as Keras' and transformers' EarlyStoppingCallback: a tie never
// improves), and the first one is the best by default. The run stops after
// `patience` evaluations in a row without an improvement. `export: best`
// alone watches eval_loss the same way and never stops.
//
// The decisions are pure functions of an EvalProgress, which the run keeps
// in its TrainPosition (checkpoint.h): checkpoints and snapshots hold it, so
// a resumed or rolled-back run decides as the run it continues would have.
//
// Thread-safe: const.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_EARLY_STOPPING_H_
#define BALLAST_WORKER_TRAIN_TRAINER_EARLY_STOPPING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/checkpoint/checkpoint.h"

namespace ballast::train {

struct EarlyStoppingRule {
  // "eval_loss" (lower is better), "mrr_at_10" or "ndcg_at_10" (higher).
  std::string metric = "eval_loss";
  // Evaluations in a row without an improvement before the run stops; 0
  // never stops (export: best without early_stopping).
  int64_t patience = 0;
  double min_delta = 0;
  int64_t warmup_evals = 0;

  // The rule of a spec that ValidateJobSpec accepted: early_stopping's, or
  // export: best's (eval_loss, never stopping); nullopt when the job
  // exports its last step and watches nothing.
  static std::optional<EarlyStoppingRule> FromSpec(const v1::JobSpec& spec);
};

class EarlyStopping {
 public:
  explicit EarlyStopping(EarlyStoppingRule rule) : rule_(std::move(rule)) {}

  const EarlyStoppingRule& rule() const { return rule_; }
  bool higher_is_better() const { return rule_.metric != "eval_loss"; }

  // The watched metric of `report`; nullopt when it has none (an eval set
  // whose rows within eval.max_tokens hold no supervised token), which
  // leaves the progress as it is.
  std::optional<double> MetricOf(const v1::EvalReport& report) const;

  // Whether an evaluation of `value` after `progress` would be the new best:
  // past the warmup, and the first, or better than the best by more than
  // min_delta. A NaN never is.
  bool Improves(const EvalProgress& progress, double value) const;

  // `progress` after an evaluation at `step` of `value`. `best`: it
  // improves and its weights were kept in a checkpoint (only then can it be
  // the best: a state the checkpoint refused is never exported).
  EvalProgress Record(EvalProgress progress, int64_t step, double value, bool best) const;

  // Whether the run stops after `progress` (never with patience 0).
  bool ShouldStop(const EvalProgress& progress) const;

  // TrainingEnd.stop_reason of a run that stopped at `step`: "stopped early
  // at step 12: eval_loss did not improve by 0.01 for 3 evaluations since
  // step 6".
  std::string StopReason(const EvalProgress& progress, int64_t step) const;
  // TrainingEnd.export_reason of the best's export: "the best eval_loss,
  // 1.234 at step 6".
  std::string BestReason(const EvalProgress& progress) const;

 private:
  const EarlyStoppingRule rule_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_EARLY_STOPPING_H_
