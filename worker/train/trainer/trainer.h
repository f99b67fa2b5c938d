// Trainer: one rank of a job, run from its spec to max_steps.
//
// The step reads top to bottom (Step below):
//   batch -> reduce token counts -> forward -> objective (sum, count) ->
//   backward -> reduce sums of squares -> grad_norm -> guard -> clip ->
//   optimizer -> metrics
// The loss of every micro-batch is divided by the supervised-token count of
// the whole optimizer step over all ranks (never per micro-batch, never by
// numel). The model, the objective, the guard and the collectives are
// components the step calls, each in its own folder of worker/train/; the
// model is a TrainedState (recovery/trained_state.h), whole on one rank and
// sharded over several, and the step never asks which. Run() adds resume,
// checkpoints, snapshots and rollbacks (Recovery, recovery/recovery.h) and
// the reports (Reporter, reporter.h).
//
// Thread-compatible: one thread drives a Trainer.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_TRAINER_H_
#define BALLAST_WORKER_TRAIN_TRAINER_TRAINER_H_

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/data/step_batches.h"
#include "worker/train/data/training_data.h"
#include "worker/train/guard/fault_injection.h"
#include "worker/train/guard/guard.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/moe_step_stats.h"
#include "worker/train/model/param_store.h"
#include "worker/train/model/routing_bias.h"
#include "worker/train/model/step_routing.h"
#include "worker/train/objective/objective.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/recovery/recovery.h"
#include "worker/train/recovery/trained_state.h"
#include "worker/train/trainer/delay_injection.h"
#include "worker/train/trainer/early_stopping.h"
#include "worker/train/trainer/reporter.h"
#include "worker/train/trainer/straggler_watch.h"
#include "worker/train/trainer/training_observer.h"

namespace ballast::train {

struct TrainerOptions {
  // Unset resumes from the newest good checkpoint (checkpoint.h). N resumes
  // from the newest good one at or before step N and deletes the newer ones
  // (a rollback); with none at or before N (N = 0 among them), training
  // starts over from the initial weights.
  std::optional<int64_t> resume_at_or_before;
  // Gets every report and is asked between steps whether to stop; null for a
  // standalone run. Not owned; it must outlive the Trainer.
  TrainingObserver* observer = nullptr;
  // Where checkpoints live once saved, which the guard rolls back to and
  // marks good: a worker's rank commits each from out_dir/checkpoints into
  // the job's output (rank/attempt_output.h). Empty: out_dir/checkpoints.
  std::string kept_checkpoints_dir;
  // Where the step's tensors live: the CPU, or a GPU (rank/device_info.h
  // chooses). With more than one rank, the collectives' device too.
  c10::Device device = c10::kCPU;
  // The job's ranks; null for a job of one rank. With more than one, the
  // model is sharded across them (ZeRO-3, worker/train/shard/) and each rank
  // takes an equal share of every step's micro-batches. Not owned; it must
  // outlive the Trainer.
  Collectives* collectives = nullptr;
  // The job's token cache (data/token_cache.h), shared by its attempts.
  // Empty: out_dir/data-cache.
  std::string data_cache_dir;
  // The watchdog's faults, for its tests (delay_injection.h).
  DelayInjection delays;
};

class Trainer {
 public:
  // Loads the model, the adapters and the data of a spec that
  // ballast::PrepareJobSpec (common/job_spec_files.h) accepted, before any
  // compute; the spec's rules (ranges, model_type, seq_len against the model)
  // live there alone. Errors:
  //   INVALID_ARGUMENT  a value the model or the data contradicts (a task or
  //                     device this build does not train, a token outside the
  //                     vocabulary, a NaN or an infinity in the base weights),
  //                     naming the field, the file and line, or the tensor
  //                     and element
  //   NOT_FOUND         a missing file or tensor, naming it
  //   FAILED_PRECONDITION a tensor whose shape disagrees with config.json, or
  //                     an init_adapter that disagrees with the spec
  //   DATA_LOSS         a corrupt safetensors file, naming it
  //   RESOURCE_EXHAUSTED the model does not fit in memory
  // Never throws: LibTorch's exceptions become INTERNAL (or
  // RESOURCE_EXHAUSTED for an allocation failure).
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir,
                                                         TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from the checkpoint TrainerOptions picks (or from the start) to
  // max_steps, appending to out_dir/metrics.jsonl and checkpointing every
  // spec.checkpoint_every steps, then exports out_dir/adapter (LoRA) or
  // out_dir/model (full). Returns OK when the export is written, and else:
  //   CANCELLED          the observer asked to stop: the step in progress
  //                      finished, nothing more was written
  //   FAILED_PRECONDITION the guard's rollback budget is spent, it asked
  //                      for a rollback with no checkpoint to go back to, or
  //                      too few of the job's steps were applied
  //                      (guard.min_applied_fraction); the message is the
  //                      diagnosis (step, reason)
  //   DATA_LOSS          the checkpoint to resume from is corrupt
  //   RESOURCE_EXHAUSTED an allocation failed
  //   INTERNAL           a write failed, or LibTorch threw
  // Never throws.
  absl::Status Run();

  // One optimizer step from `*position`, which it advances (step and data
  // cursor). The returned metrics are what metrics.jsonl and the observer
  // get; `verdict` is what the ranks agreed the guard does with the step
  // (the update is applied only for kApply; after a transient fault, the
  // re-run's; its reason is the skip's). May throw c10::Error from LibTorch.
  v1::StepMetrics Step(TrainPosition* position, GuardVerdict* verdict);

  // Every tensor of the model, by name (a sharded model's hold data only
  // while their unit is gathered).
  const ParamStore& params() const { return state_->weights(); }
  const AdamW& optimizer() const { return optimizer_; }

 private:
  Trainer(v1::JobSpec spec, std::string out_dir, TrainerOptions options, ModelConfig config,
          std::unique_ptr<TrainedState> state, std::optional<LoraConfig> lora, TrainingData data,
          std::unique_ptr<Objective> objective, std::unique_ptr<RoutingBias> routing_bias,
          bool bias_from_model);

  // What one run of a step's forward and backward measured, over all ranks.
  struct StepNumbers {
    int64_t tokens = 0;
    int64_t supervised_tokens = 0;
    double loss_sum = 0;
    // A mixture of experts' load-balancing loss (load_balancing.h, without
    // its coefficient), summed over the step's micro-batches on all ranks.
    double aux_loss_sum = 0;
    // A mixture of experts' routing over the step, its aux loss the step's
    // (global, or the mean of the micro-batches'), and the reduced counts it
    // comes from (what moe.balance aux_free's bias update reads); absent for
    // a dense model.
    std::optional<MoeStepStats> moe;
    std::optional<StepRouting> routing;
    // Per tensor of what the optimizer updates (a sharded model's flat
    // buckets), over all ranks; empty when no forward ran.
    std::vector<double> sum_squares;
  };

  absl::Status RunSteps();
  // Forward and backward of the step's micro-batches, the reductions, and
  // the step's one read from the device. `rerun`: the guard's second run.
  StepNumbers Compute(const std::vector<PackedBatch>& micro_batches, int64_t step, bool rerun);
  // A mixture of experts: the decoder indices of its sparse layers; a
  // forward's routing record for `batch` (its balanced tokens, the scope,
  // the loss's weight); and the step's routing counts, summed over ranks,
  // from a forward of each micro-batch without autograd (global balancing).
  std::vector<int64_t> SparseLayers() const;
  std::shared_ptr<RoutingStats> NewRoutingStats(const PackedBatch& batch, double weight) const;
  StepRouting RoutingPrePass(const std::vector<PackedBatch>& micro_batches);
  // Warns (rank 0, once a run) when the training forwards of `step` routed
  // otherwise than its pre-pass counted, both summed over ranks.
  void CheckPrePass(const StepRouting& pre_pass, const StepRouting& forwards, int64_t step);
  // Fills the metrics' loss, grad_norm and counts, and returns what the
  // guard judges. When the gradient is not finite, also `norms`, and the
  // first non-finite tensor and its rank in the health (every rank must
  // call it then: it reduces).
  StepHealth Measure(const StepNumbers& numbers, v1::StepMetrics* metrics, TensorNorms* norms);
  // The guard's verdict on the step, agreed by every rank.
  GuardVerdict Judge(const StepHealth& health);
  void ClearGradients();
  // What a step's metrics are measured from: the clock, and the rank's
  // counters of traffic and of time in collectives, read as it begins.
  struct StepStart {
    std::chrono::steady_clock::time_point time;
    int64_t communicated_bytes = 0;
    int64_t replica_communicated_bytes = 0;
    double collective_ms = 0;
  };
  StepStart MarkStepStart() const;
  // The step's time, throughput, traffic (all, and across hybrid sharding's
  // replicas), time waiting on collectives and peak memory.
  void FinishMetrics(const StepStart& start, v1::StepMetrics* metrics) const;
  // Writes and reports the checkpoint of `position` (Recovery::SaveCheckpoint
  // for `last` and the errors; a refusal is reported as a guard event).
  absl::Status Checkpoint(const TrainPosition& position, bool last);
  // The end of a run that must not succeed: a diagnosis of the whole run
  // (rank -1) at `step`, for `reason`, with nothing exported.
  absl::Status FailRun(GuardTrigger trigger, int64_t step, const std::string& reason);
  // Goes back to the newest good snapshot or checkpoint from before the
  // trouble, past the data that led there, or fails with the guard's
  // diagnosis when it cannot.
  absl::Status Rollback(const GuardVerdict& verdict, int64_t step, TrainPosition* position);
  // Evaluates the held-out set at `step`: the validation loss of eval, or
  // a reranker's MRR@10 and NDCG@10 (reranker.eval_path); nullopt without
  // one. No gradient, optimizer state, generator or guard is touched.
  std::optional<v1::EvalReport> Evaluate(int64_t step);
  // Evaluates at `position->step`, judges the evaluation by early stopping
  // (or export: best), which advances `position->eval`, keeps a new best's
  // weights in checkpoint `position->step` (setting `checkpointed`; the last
  // step's is RunSteps' own), and reports it. Errors: Checkpoint's but a
  // refusal (that evaluation cannot be the best), and the report's line.
  absl::Status EvaluateAndJudge(TrainPosition* position, bool* checkpointed);
  // Steps between evaluations: eval.every, or reranker.eval_every.
  int64_t EvalEvery() const;
  absl::Status Export();
  // Agreed by every rank after each step, in one all-reduce: whether any
  // rank was asked to stop, and each one's own time in the step (`own_s`
  // here), which rank 0's straggler watch judges.
  bool AgreeAfterStep(int64_t step, double own_s);

  const v1::JobSpec spec_;
  const std::string out_dir_;
  const c10::Device device_;
  SingleRank single_rank_;
  Collectives* const collectives_;
  Reporter reports_;
  ModelConfig config_;
  std::unique_ptr<TrainedState> state_;
  std::optional<LoraConfig> lora_;
  bool pre_pass_differed_ = false;  // CheckPrePass said so
  TrainingData data_;
  StepBatches batches_;
  Decoder decoder_;
  std::unique_ptr<Objective> objective_;
  AdamW optimizer_;
  // moe.aux_loss global (else micro_batch), and moe.aux_loss_scope.
  const bool global_balancing_;
  const AuxLossScope aux_loss_scope_;
  // moe.balance aux_free's per-expert routing bias; null otherwise. Before
  // recovery_, which saves and restores it.
  const std::unique_ptr<RoutingBias> routing_bias_;
  Guard guard_;
  FaultInjection injection_;
  const DelayInjection delays_;
  // Rank 0's: the ranks' own step times, after each step.
  StragglerWatch stragglers_;
  Recovery recovery_;
  // early_stopping's rule, or export: best's; absent when the job exports
  // its last step.
  const std::optional<EarlyStopping> early_stopping_;
  // The guard event of the step in progress, when it was not applied as it
  // came.
  v1::GuardEvent anomaly_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_TRAINER_H_
