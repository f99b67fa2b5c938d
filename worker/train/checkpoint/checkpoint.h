// Training checkpoints: everything needed to continue a run exactly.
//
// Layout: OUT/checkpoints/step-00000005/ with
//   params.safetensors     trainable tensors (fp32 masters)
//   optimizer.safetensors  AdamW moments and step counter
//   rng.safetensors        the CPU generator state (dropout, init)
//   buffers.safetensors    model tensors no gradient trains, the same on
//                          every rank (moe.balance aux_free's routing bias);
//                          absent when the model has none
//   state.json             {"step": 5, "data_cursor": 40}, and the
//                          evaluations' progress once there is one:
//                          "evaluations", "best_step", "best_value",
//                          "since_best"
//   UNVERIFIED             present until the checkpoint is good
// A checkpoint is written into a hidden temporary folder and renamed into
// place, so a folder named step-* is always complete. One holding a
// non-finite value is never written.
//
// Health: a checkpoint is good once enough clean steps have followed it
// (guard.good_after_steps); until then it carries an UNVERIFIED file, put
// there before the rename, and resume and rollback pass it by. Checkpoints
// written before this marker existed count as good.
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/train/model/param_store.h"
#include "worker/train/optim/adamw.h"

namespace ballast::train {

// What the evaluations so far decided (trainer/early_stopping.h): part of the
// position, so that a resumed or rolled-back run judges its next evaluation
// as the run it continues would have.
struct EvalProgress {
  // Evaluations of the watched metric so far (warmup ones included).
  int64_t evaluations = 0;
  // The best one past the warmup and its value; best_step -1: none yet.
  int64_t best_step = -1;
  double best_value = 0;
  // Evaluations past the warmup since the best, none of which improved on it.
  int64_t since_best = 0;

  bool operator==(const EvalProgress&) const = default;
};

struct TrainPosition {
  int64_t step = 0;         // optimizer steps completed
  int64_t data_cursor = 0;  // examples consumed
  EvalProgress eval;
};

enum class CheckpointHealth { kGood, kUnverified };

// The steps of writing a checkpoint folder, shared by both layouts:
// BeginCheckpoint empties and creates tmp_dir, the caller writes its files
// there, and PublishCheckpoint adds state.json and the buffers and renames
// tmp_dir to final_dir (replacing a folder of the same step).
struct CheckpointFolder {
  std::string final_dir;  // checkpoints/step-00000005
  std::string tmp_dir;    // checkpoints/.step-00000005.tmp
};
CheckpointFolder CheckpointFolderFor(const std::string& checkpoints_dir, int64_t step);
absl::Status BeginCheckpoint(const CheckpointFolder& folder);
// After a failed write (a full disk): removes tmp_dir, so the space comes
// back and nothing half-written is left beside the good checkpoints.
void AbandonCheckpoint(const CheckpointFolder& folder);
absl::Status PublishCheckpoint(const CheckpointFolder& folder, const TrainPosition& position,
                               CheckpointHealth health,
                               const std::map<std::string, at::Tensor>& buffers = {});

// The name of the first tensor holding a NaN or an infinity, or nullopt.
std::optional<std::string> FirstNonFinite(const std::map<std::string, at::Tensor>& tensors);

// Writes checkpoint `position.step` under `checkpoints_dir` and returns its
// folder, with `buffers` (see the layout). FAILED_PRECONDITION (and nothing
// written) when a trainable tensor, the optimizer's state or a buffer holds
// a NaN or an infinity.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& checkpoints_dir,
                                           const TrainPosition& position, const ParamStore& params,
                                           const AdamW& optimizer, CheckpointHealth health,
                                           const std::map<std::string, at::Tensor>& buffers = {});

// The folder of the newest good checkpoint at or before step `max_step`, or
// nullopt when there is none. Leftover temporary folders of an interrupted
// save are removed.
std::optional<std::string> LatestCheckpoint(const std::string& checkpoints_dir,
                                            int64_t max_step = std::numeric_limits<int64_t>::max());

// The step a checkpoint folder holds (from its name), or nullopt.
std::optional<int64_t> CheckpointStepOf(const std::string& dir);

// Deletes every checkpoint newer than `max_step`, so that later restarts
// cannot jump past it, and returns the newest good one left (nullopt when
// none). INTERNAL names a folder that could not be removed.
absl::StatusOr<std::optional<std::string>> KeepCheckpointsAtOrBefore(
    const std::string& checkpoints_dir, int64_t max_step);

// Removes a checkpoint's UNVERIFIED file: it is good from now on.
absl::Status MarkCheckpointGood(const std::string& dir);
bool IsGoodCheckpoint(const std::string& dir);

// Deletes all but the newest `keep` checkpoints, never the newest good one,
// nor one of `best_steps` (the best evaluations that the run's state and the
// snapshots it may roll back to would export), nor the best evaluation's
// that a kept checkpoint's state.json names (a rollback or restart to that
// checkpoint would export it). keep 0 deletes nothing. INTERNAL names a
// folder that could not be removed.
absl::Status RotateCheckpoints(const std::string& checkpoints_dir, int64_t keep,
                               absl::Span<const int64_t> best_steps = {});

// Restores params, optimizer and RNG from a checkpoint folder, of a job of
// one rank or a sharded one (sharded_checkpoint.h), and returns its
// position. DATA_LOSS names the file or tensor that is missing or corrupt.
absl::StatusOr<TrainPosition> LoadCheckpoint(const std::string& dir, ParamStore* params,
                                             AdamW* optimizer);

// A checkpoint folder's buffers, of either layout, on the host; none when it
// has no buffers.safetensors. DATA_LOSS when the file is corrupt.
absl::StatusOr<std::map<std::string, at::Tensor>> LoadCheckpointBuffers(const std::string& dir);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
