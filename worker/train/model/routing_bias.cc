#include "worker/train/model/routing_bias.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {

RoutingBias::RoutingBias(std::vector<int64_t> sparse_layers, int64_t num_experts, double rate,
                         c10::Device device)
    : sparse_layers_(std::move(sparse_layers)), rate_(rate) {
  const int64_t layers =
      sparse_layers_.empty() ? 0 : *std::max_element(sparse_layers_.begin(), sparse_layers_.end());
  bias_.resize(sparse_layers_.empty() ? 0 : layers + 1);
  for (int64_t layer : sparse_layers_) {
    bias_[layer] = at::zeros({num_experts}, at::TensorOptions().dtype(at::kFloat).device(device));
  }
}

std::string RoutingBias::TensorName(int64_t layer) {
  return LayerPrefix(layer) + "mlp.gate.e_score_correction_bias";
}

const at::Tensor& RoutingBias::of(int64_t layer) const {
  static const at::Tensor kNone;
  return layer >= 0 && layer < static_cast<int64_t>(bias_.size()) ? bias_[layer] : kNone;
}

void RoutingBias::Update(const StepRouting& step) {
  TORCH_CHECK(step.sparse_layers() == sparse_layers_, "RoutingBias: the step's layers differ");
  for (size_t i = 0; i < sparse_layers_.size(); ++i) {
    // fp64 counts, exact: every rank finds the same signs.
    const at::Tensor load = step.ExpertCounts(static_cast<int64_t>(i));  // (E)
    const at::Tensor step_e = at::sign(load.mean() - load) * rate_;
    at::Tensor& bias = bias_[sparse_layers_[i]];
    bias.add_(step_e.to(bias.options()));
  }
}

std::map<std::string, at::Tensor> RoutingBias::Tensors() const {
  std::map<std::string, at::Tensor> out;
  for (int64_t layer : sparse_layers_) out[TensorName(layer)] = bias_[layer].cpu().clone();
  return out;
}

absl::Status RoutingBias::Restore(const std::map<std::string, at::Tensor>& tensors) {
  // All checked before any is copied: a refused set leaves the biases as they were.
  for (int64_t layer : sparse_layers_) {
    const std::string name = TensorName(layer);
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      return absl::DataLossError(absl::StrCat("no ", name, " (moe.balance aux_free's bias)"));
    }
    if (!it->second.sizes().equals(bias_[layer].sizes())) {
      return absl::DataLossError(absl::StrCat(name, " has shape [",
                                              absl::StrJoin(it->second.sizes(), ", "),
                                              "]; expected [", bias_[layer].numel(), "]"));
    }
  }
  for (int64_t layer : sparse_layers_) bias_[layer].copy_(tensors.at(TensorName(layer)));
  return absl::OkStatus();
}

absl::StatusOr<bool> RoutingBias::StartFrom(const std::string& model_dir,
                                            const ModelConfig& config) {
  absl::StatusOr<SafetensorsCheckpoint> checkpoint = SafetensorsCheckpoint::Open(model_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  std::map<std::string, at::Tensor> saved;
  for (int64_t layer : sparse_layers_) {
    const std::string stored = CheckpointName(config, TensorName(layer));
    if (!checkpoint->contains(stored)) continue;
    absl::StatusOr<at::Tensor> t = checkpoint->tensor(stored);
    if (!t.ok()) return t.status();
    saved[TensorName(layer)] = t->to(at::kFloat);
  }
  if (saved.empty()) return false;
  if (absl::Status s = Restore(saved); !s.ok()) {
    return absl::DataLossError(absl::StrCat(model_dir, ": ", s.message()));
  }
  return true;
}

}  // namespace ballast::train
