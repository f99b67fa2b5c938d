#include "worker/train/recovery/trained_state.h"

#include <torch/torch.h>

#include <cmath>

#include "common/spec_rules.h"
#include "worker/train/checkpoint/sharded_checkpoint.h"
#include "worker/train/model/finite_weights.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/shard/sharded_model.h"

namespace ballast::train {
namespace {

// The index of the first non-finite value, or -1.
int64_t FirstNonFinite(const std::vector<double>& values) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

// One rank: the whole model, in place.
class WholeState : public TrainedState {
 public:
  explicit WholeState(ParamStore params) : params_(std::move(params)) {}

  const ParamStore& weights() const override { return params_; }
  LayerRunner* layer_runner() override { return nullptr; }
  ParamStore& trained() override { return params_; }
  void BeginForward() override {}
  void FinishBackward() override {}
  void EndForward() override {}

  TensorNorms GradNormsByTensor(const std::vector<double>& reduced) override {
    TensorNorms norms;
    norms.names = params_.TrainableNames();
    norms.sum_squares = reduced;
    norms.first_nonfinite = FirstNonFinite(reduced);
    return norms;
  }

  std::vector<std::pair<std::string, at::Tensor>> FullTensors(bool trainable_only) override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const std::string& name : trainable_only ? params_.TrainableNames() : params_.names()) {
      out.emplace_back(name, params_.get(name));
    }
    return out;
  }

  absl::StatusOr<std::string> Save(const std::string& checkpoints_dir,
                                   const TrainPosition& position, const AdamW& optimizer,
                                   CheckpointHealth health,
                                   const std::map<std::string, at::Tensor>& buffers) override {
    return SaveCheckpoint(checkpoints_dir, position, params_, optimizer, health, buffers);
  }

  absl::StatusOr<TrainPosition> Load(const std::string& dir, AdamW* optimizer) override {
    return LoadCheckpoint(dir, &params_, optimizer);
  }

  ResidentBytes resident_bytes() const override {
    ResidentBytes bytes;
    for (const std::string& name : params_.names()) bytes.parameters += params_.get(name).nbytes();
    bytes.gradients = params_.TrainableNumel() * static_cast<int64_t>(sizeof(float));
    return bytes;
  }

 private:
  ParamStore params_;
};

// N ranks: ShardedModel, and the sharded checkpoint layout.
class ShardedState : public TrainedState {
 public:
  ShardedState(ParamStore full, Collectives* collectives, at::ScalarType compute_dtype,
               c10::Device device, Zero3Options options)
      : collectives_(collectives),
        model_(std::move(full), collectives, compute_dtype, device, options) {}

  const ParamStore& weights() const override { return model_.gathered(); }
  LayerRunner* layer_runner() override { return &model_; }
  Collectives* expert_group() override { return model_.expert_group(); }
  ParamStore& trained() override { return model_.masters(); }
  void BeginForward() override { model_.GatherRoots(); }
  void FinishBackward() override { model_.FinishBackward(); }
  void EndForward() override { model_.ReleaseRoots(); }
  void FinishGradients() override { model_.ReduceAcrossReplicas(); }
  double grad_norm_share() const override { return model_.counts_in_grad_norm() ? 1 : 0; }

  TensorNorms GradNormsByTensor(const std::vector<double>&) override {
    // The reduced sums are per bucket here: each tensor's are measured again.
    auto [names, partial] = model_.GradSumSquaresByTensor();
    // A copy: on the CPU .cpu() is the same tensor, which the sum overwrites.
    const at::Tensor own = partial.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true);
    collectives_->SumInPlace(partial);
    const at::Tensor global = partial.cpu();
    TensorNorms norms;
    norms.names = std::move(names);
    norms.sum_squares.assign(global.const_data_ptr<double>(),
                             global.const_data_ptr<double>() + global.numel());
    norms.first_nonfinite = FirstNonFinite(norms.sum_squares);
    const int n_ranks = collectives_->world_size();
    const bool mine = norms.first_nonfinite >= 0 &&
                      !std::isfinite(own.const_data_ptr<double>()[norms.first_nonfinite]);
    norms.first_nonfinite_rank =
        static_cast<int>(n_ranks - collectives_->Max(mine ? n_ranks - collectives_->rank() : 0));
    return norms;
  }

  std::vector<std::pair<std::string, at::Tensor>> FullTensors(bool trainable_only) override {
    return model_.GatherFullTensors(trainable_only);
  }

  absl::StatusOr<std::string> Save(const std::string& checkpoints_dir,
                                   const TrainPosition& position, const AdamW& optimizer,
                                   CheckpointHealth health,
                                   const std::map<std::string, at::Tensor>& buffers) override {
    return SaveShardedCheckpoint(checkpoints_dir, position, model_, optimizer, collectives_, health,
                                 buffers);
  }

  absl::StatusOr<TrainPosition> Load(const std::string& dir, AdamW* optimizer) override {
    return LoadShardedCheckpoint(dir, &model_, optimizer, collectives_);
  }

  ResidentBytes resident_bytes() const override {
    return {model_.parameter_bytes(), model_.gradient_bytes(), model_.gathered_buffer_bytes()};
  }

 private:
  Collectives* const collectives_;
  ShardedModel model_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TrainedState>> LoadTrainedState(
    const v1::JobSpec& spec, const ModelConfig& config, const std::optional<LoraConfig>& lora,
    Collectives* collectives, c10::Device device) {
  const bool sharded = collectives != nullptr && collectives->world_size() > 1;
  // Mapped when sharded: each rank copies only its share.
  absl::StatusOr<ParamStore> params =
      LoadPretrained(spec.model().path(), config, /*trainable=*/!lora,
                     sharded ? PretrainedTensors::kMapped : PretrainedTensors::kOwnedFp32);
  if (!params.ok()) return params.status();
  // Before anything is built on them: every rank checks its share of the
  // tensors, and all learn the whole model's result from one sum.
  at::Tensor nonfinite = FirstNonFiniteElements(*params, sharded ? collectives->rank() : 0,
                                                sharded ? collectives->world_size() : 1);
  if (sharded) {
    nonfinite = nonfinite.to(device);
    collectives->SumInPlace(nonfinite);
  }
  if (absl::Status s = RefuseNonFiniteWeights(*params, nonfinite, spec.model().path()); !s.ok()) {
    return s;
  }
  // Seeds LoRA init and dropout; checkpoints carry the generator onward.
  torch::manual_seed(spec.seed());
  if (lora) {
    if (absl::Status s = AddLoraAdapters(config, *lora, &*params); !s.ok()) return s;
    if (!spec.lora().init_adapter().empty()) {
      absl::Status s = LoadPeftAdapter(spec.lora().init_adapter(), config, *lora, &*params);
      if (!s.ok()) return s;
    }
  }
  const at::ScalarType compute = spec.precision() == "bf16" ? torch::kBFloat16 : torch::kFloat;
  if (!sharded) {
    params->MoveTo(device, compute);
    return std::make_unique<WholeState>(*std::move(params));
  }
  // Every rank built the same whole model from the same seed; each keeps its
  // shard of it, and draws its own dropout masks from here on.
  // ValidateJobSpec allows bf16 reductions only under precision bf16.
  const Zero3Options zero3 = {
      .prefetch = spec.zero3().prefetch() > 0
                      ? spec.zero3().prefetch()
                      : static_cast<int>(SpecDefaultNumber("zero3.prefetch")),
      .reduce_dtype = spec.zero3().reduce_dtype() == "bf16" ? torch::kBFloat16 : torch::kFloat,
      .expert_parallel = spec.moe().expert_parallel() > 1};
  std::unique_ptr<TrainedState> state =
      std::make_unique<ShardedState>(*std::move(params), collectives, compute, device, zero3);
  torch::manual_seed(spec.seed() + collectives->rank());
  return state;
}

}  // namespace ballast::train
