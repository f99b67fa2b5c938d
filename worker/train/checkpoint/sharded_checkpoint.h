// Sharded checkpoints of a ZeRO-3 job: OUT/checkpoints/step-00000005/ with
//   layout.json          {"world_size": N, "buckets": [{"key", "numel",
//                         "tensors": [{"name", "shape", "offset"}]}]}: the
//                         trainable buckets of FlatLayout, in unpadded
//                         coordinates
//   rank-R.safetensors   rank R's elements of each trainable bucket: "<key>"
//                         (fp32 masters), "<key>.exp_avg", "<key>.exp_avg_sq",
//                         and "__step__" (AdamW's counter), "__rng__" (its
//                         generator)
//   state.json           {"step", "data_cursor"}, as for one rank
// Frozen weights are not saved: they are the base model's.
//
// Hybrid sharding (collectives.h) writes the same folder at N = the shard
// group's size G: the first replica's ranks write rank-0 .. rank-(G-1)
// (the shards, the same in every replica), and each rank R of the other
// replicas rng-R.safetensors with its generator alone. So a hybrid
// checkpoint loads into ZeRO-3 at any N, or into another hybrid shape, and
// back, by the same ranges as any other.
//
// Saving: rank 0 prepares the hidden temporary folder; after a barrier every
// rank writes its file there; after a second barrier rank 0 writes
// layout.json and state.json and renames the folder into place; a third
// barrier returns. The checkpoint is whole or absent. A checkpoint with a
// non-finite value on any rank is written by none.
//
// Loading reads each rank's own ranges (CheckpointReader), so a job resumes
// at any world size, from a sharded or a single-rank checkpoint.
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_SHARDED_CHECKPOINT_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_SHARDED_CHECKPOINT_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/shard/sharded_model.h"

namespace ballast::train {

// Every rank calls it. Returns the checkpoint's folder. FAILED_PRECONDITION
// (and nothing written) when a trainable shard or the optimizer's state
// holds a NaN or an infinity. Rank 0 writes `buffers`, the same on every
// rank (checkpoint.h).
absl::StatusOr<std::string> SaveShardedCheckpoint(const std::string& checkpoints_dir,
                                                  const TrainPosition& position,
                                                  const ShardedModel& model, const AdamW& optimizer,
                                                  Collectives* collectives, CheckpointHealth health,
                                                  const std::map<std::string, at::Tensor>& buffers);

// Restores this rank's shards, moments and generator. DATA_LOSS names the
// missing or corrupt file or tensor.
absl::StatusOr<TrainPosition> LoadShardedCheckpoint(const std::string& dir, ShardedModel* model,
                                                    AdamW* optimizer, Collectives* collectives);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_SHARDED_CHECKPOINT_H_
