// CheckpointReader: the trained state of a checkpoint folder as flat ranges,
// whatever world size wrote it. A range is named by a FlatBucket of
// FlatLayout (worker/train/shard/flat_layout.h), whose offsets do not depend
// on the world size, so one rank of any job can read exactly its elements:
//   single-rank layout  params.safetensors / optimizer.safetensors by tensor name
//   sharded layout      layout.json and rank-R.safetensors per bucket shard
//                       (sharded_checkpoint.h)
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_READER_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_READER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/shard/flat_layout.h"

namespace ballast::train {

// The position a checkpoint folder's state.json records (its evaluations'
// progress included). DATA_LOSS when the file is missing or corrupt.
absl::StatusOr<TrainPosition> ReadCheckpointPosition(const std::string& dir);

class CheckpointReader {
 public:
  // What a bucket range holds: the fp32 masters, or one of AdamW's moments.
  enum class Part { kParams, kExpAvg, kExpAvgSq };

  // DATA_LOSS names the missing or corrupt file.
  static absl::StatusOr<CheckpointReader> Open(const std::string& dir);

  bool sharded() const { return world_size_ > 0; }
  // Elements [lo, hi) of `bucket`'s flat concatenation, fp32 (hi <= numel).
  // DATA_LOSS when the checkpoint lacks a tensor or lays the bucket out
  // otherwise (another model or adapter configuration).
  absl::StatusOr<at::Tensor> Range(const FlatBucket& bucket, Part part, int64_t lo,
                                   int64_t hi) const;
  // AdamW's step counter.
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // The generator states rank `rank` saved (in its rng-R file when a hybrid
  // job's replica saved no shards; the last saved rank's when the checkpoint
  // had fewer ranks), keyed as GeneratorStates() keys them
  // (model/rng_state.h). DATA_LOSS without the CPU's.
  absl::StatusOr<std::map<std::string, at::Tensor>> GeneratorStates(int rank) const;
  // The name a rank's shard file keeps generator `key` under, among its
  // optimizer and parameter shards.
  static std::string ShardedGeneratorKey(const std::string& key) {
    return key == "cpu" ? "__rng__" : "__rng_" + key + "__";
  }
  // The files of a sharded checkpoint: shard `r`'s (its generator too), and
  // a hybrid job's rank `r` that saved no shard (sharded_checkpoint.h).
  static std::string ShardFileName(int r) { return "rank-" + std::to_string(r) + ".safetensors"; }
  static std::string GeneratorFileName(int r) {
    return "rng-" + std::to_string(r) + ".safetensors";
  }
  const TrainPosition& position() const { return position_; }

 private:
  CheckpointReader() = default;
  absl::Status CheckBucket(const FlatBucket& bucket) const;

  std::string dir_;
  int world_size_ = 0;                                   // 0: the single-rank layout
  FlatLayout saved_;                                     // sharded: the layout it was saved with
  std::vector<std::shared_ptr<SafetensorsFile>> files_;  // params, optimizer, rng | rank files
  int64_t optimizer_steps_ = 0;
  TrainPosition position_;
};

// Suffix of a part in tensor names: "", ".exp_avg", ".exp_avg_sq".
const char* PartSuffix(CheckpointReader::Part part);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_CHECKPOINT_READER_H_
