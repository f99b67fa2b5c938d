// Training checkpoints: everything needed to continue a run exactly.
//
// Layout: OUT/checkpoints/step-00000005/ with
//   params.safetensors     trainable tensors (fp32 masters)
//   optimizer.safetensors  AdamW moments and step counter
//   rng.safetensors        the CPU generator state (dropout, init)
//   state.json             {"step": 5, "data_cursor": 40}
// A checkpoint is written into a hidden temporary folder and renamed into
// place, so a folder named step-* is always complete. One holding a
// non-finite value is never written.
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/train/model/param_store.h"
#include "worker/train/optim/adamw.h"

namespace ballast::train {

struct TrainPosition {
  int64_t step = 0;         // optimizer steps completed
  int64_t data_cursor = 0;  // examples consumed
};

// The steps of writing a checkpoint folder, shared by both layouts:
// BeginCheckpoint empties and creates tmp_dir, the caller writes its files
// there, and PublishCheckpoint adds state.json and renames tmp_dir to
// final_dir (replacing a folder of the same step).
struct CheckpointFolder {
  std::string final_dir;  // checkpoints/step-00000005
  std::string tmp_dir;    // checkpoints/.step-00000005.tmp
};
CheckpointFolder CheckpointFolderFor(const std::string& checkpoints_dir, int64_t step);
absl::Status BeginCheckpoint(const CheckpointFolder& folder);
absl::Status PublishCheckpoint(const CheckpointFolder& folder, const TrainPosition& position);

// Writes checkpoint `position.step` under `checkpoints_dir` and returns its
// folder. FAILED_PRECONDITION (and nothing written) when a trainable tensor
// holds a NaN or an infinity.
absl::StatusOr<std::string> SaveCheckpoint(const std::string& checkpoints_dir,
                                           const TrainPosition& position, const ParamStore& params,
                                           const AdamW& optimizer);

// The folder of the newest complete checkpoint, or nullopt when there is none.
// Leftover temporary folders of an interrupted save are removed.
std::optional<std::string> LatestCheckpoint(const std::string& checkpoints_dir);

// Deletes every checkpoint newer than `max_step`, so that later restarts
// cannot jump past it, and returns the newest one left (nullopt when none).
// INTERNAL names a folder that could not be removed.
absl::StatusOr<std::optional<std::string>> KeepCheckpointsAtOrBefore(
    const std::string& checkpoints_dir, int64_t max_step);

// Restores params, optimizer and RNG from a checkpoint folder, of a job of
// one rank or a sharded one (sharded_checkpoint.h), and returns its
// position. DATA_LOSS names the file or tensor that is missing or corrupt.
absl::StatusOr<TrainPosition> LoadCheckpoint(const std::string& dir, ParamStore* params,
                                             AdamW* optimizer);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_H_
