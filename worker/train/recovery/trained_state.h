// TrainedState: the model as one rank of a job holds and trains it, behind
// one interface whatever the world size, as Collectives (collectives.h) is
// for the communication: what the step reads and updates, the calls around
// each micro-batch, and how the state is saved, loaded and exported.
//
// Two implementations, chosen once by LoadTrainedState:
//   one rank    the whole model in a ParamStore: the decoder reads it, the
//               optimizer updates its trainable tensors, checkpoint.h saves
//               it, and the calls around a micro-batch do nothing.
//   N ranks     ShardedModel (shard/sharded_model.h, ZeRO-3, or hybrid
//               sharding over the collectives' shard and replica groups):
//               the decoder reads gathered units, the optimizer updates this
//               rank's fp32 shards, sharded_checkpoint.h saves them.
// Why not ShardedModel with a world of one: its fp32 masters are gathered
// into the compute dtype, and its checkpoints have the sharded layout, so a
// single-rank job would neither compute the numbers it computes today (the
// parity tests pin them against HF) nor write the checkpoints it writes
// today. A second implementation of a small interface keeps both, and it
// lives here, with recovery, because the checkpoint formats of both are
// below it and ShardedModel's component may not call them.
//
// Not thread-safe; with N ranks every rank makes the same calls in the same
// order (ShardedModel's rule).
#ifndef BALLAST_WORKER_TRAIN_RECOVERY_TRAINED_STATE_H_
#define BALLAST_WORKER_TRAIN_RECOVERY_TRAINED_STATE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "common/model_config.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/param_store.h"
#include "worker/train/optim/adamw.h"

namespace ballast::train {

// Each trainable tensor's global gradient sum of squares, by name, and where
// the first non-finite one is.
struct TensorNorms {
  std::vector<std::string> names;
  std::vector<double> sum_squares;
  int64_t first_nonfinite = -1;  // index into names; -1: all finite
  int first_nonfinite_rank = 0;  // the lowest rank whose own part of it is not finite
};

// What a rank keeps resident for the whole run.
struct ResidentBytes {
  int64_t parameters = 0;  // every tensor held (shards of a sharded model)
  int64_t gradients = 0;   // the fp32 gradients of the trainable ones
  int64_t gathered = 0;    // buffers for gathered units; 0 on one rank
};

class TrainedState {
 public:
  virtual ~TrainedState() = default;

  // What the decoder reads: every tensor of the model, by name (a sharded
  // model's hold data only while their unit is gathered).
  virtual const ParamStore& weights() const = 0;
  // How the decoder runs its layers; null: in place.
  virtual LayerRunner* layer_runner() = 0;
  // The ranks the experts are split over (moe.expert_parallel), which the
  // decoder sends routed rows to; null: every expert is at hand.
  virtual Collectives* expert_group() { return nullptr; }
  // What the optimizer updates and a snapshot copies: the trainable tensors,
  // or this rank's fp32 shards of them; .grad() is each one's gradient.
  virtual ParamStore& trained() = 0;

  // Around each micro-batch: BeginForward before its forward, then
  // FinishBackward after its backward (the gradients are in trained() once
  // it returns), or EndForward after a forward without backward.
  virtual void BeginForward() = 0;
  virtual void FinishBackward() = 0;
  virtual void EndForward() = 0;
  // After the step's last FinishBackward: with hybrid sharding, sums the
  // gradients over the replicas (ShardedModel::ReduceAcrossReplicas).
  virtual void FinishGradients() {}
  // The factor of this rank's gradient sums of squares in the world's sum
  // that makes grad_norm: 1, or 0 on a hybrid job's replicas but the first,
  // whose gradients are the first's (times 0 keeps a NaN a NaN).
  virtual double grad_norm_share() const { return 1; }

  // Where a bad step's gradient went wrong, from `reduced`, the step's sums
  // of squares per tensor of trained() summed over the ranks. Every rank
  // must call it (a sharded model reduces again, per tensor).
  virtual TensorNorms GradNormsByTensor(const std::vector<double>& reduced) = 0;

  // Every tensor (trainable_only: every trainable tensor) with its full
  // shape, for the export; every rank must call it. A sharded model gathers
  // them in fp32, one bucket at a time.
  virtual std::vector<std::pair<std::string, at::Tensor>> FullTensors(bool trainable_only) = 0;

  // Writes checkpoint `position.step` under `checkpoints_dir` (every rank
  // calls it), with `buffers` (checkpoint.h), and returns its folder.
  // FAILED_PRECONDITION, and nothing written, when a trainable value, the
  // optimizer's state or a buffer is not finite.
  virtual absl::StatusOr<std::string> Save(const std::string& checkpoints_dir,
                                           const TrainPosition& position, const AdamW& optimizer,
                                           CheckpointHealth health,
                                           const std::map<std::string, at::Tensor>& buffers) = 0;
  // Restores the state, the optimizer and the generator from a checkpoint
  // folder of either layout and returns its position. DATA_LOSS names what
  // is missing or corrupt.
  virtual absl::StatusOr<TrainPosition> Load(const std::string& dir, AdamW* optimizer) = 0;

  virtual ResidentBytes resident_bytes() const = 0;
};

// The state a rank of `spec`'s job starts from: the pretrained model of
// model.path with `lora`'s adapters added (initialised, or loaded from
// lora.init_adapter), built on the CPU from spec.seed so that it starts from
// the same weights on any device and every rank, then moved to `device` with
// its frozen tensors in the compute dtype (spec.precision). The whole model
// with one rank (`collectives` null or of one rank); this rank's shards of
// it with more, each rank then drawing its own dropout masks from seed +
// rank. `collectives` must outlive the state. Errors are LoadPretrained's
// and LoadPeftAdapter's (NOT_FOUND, FAILED_PRECONDITION, DATA_LOSS,
// INVALID_ARGUMENT), and INVALID_ARGUMENT for a base model holding a NaN or
// an infinity (model/finite_weights.h), on every rank.
absl::StatusOr<std::unique_ptr<TrainedState>> LoadTrainedState(
    const v1::JobSpec& spec, const ModelConfig& config, const std::optional<LoraConfig>& lora,
    Collectives* collectives, c10::Device device);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RECOVERY_TRAINED_STATE_H_
