#include "worker/train/model/step_routing.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

namespace ballast::train {

double SwitchLoss(const at::Tensor& choices, const at::Tensor& prob_sums, double tokens) {
  if (tokens <= 0) return 0;
  const at::Tensor f = choices.to(at::kDouble) / tokens;
  const at::Tensor p = prob_sums.to(at::kDouble) / tokens;
  return (f * p.unsqueeze(0)).sum().item<double>() * static_cast<double>(prob_sums.size(0));
}

StepRouting::StepRouting(std::vector<int64_t> sparse_layers, int64_t num_experts, int64_t top_k)
    : sparse_layers_(std::move(sparse_layers)), num_experts_(num_experts), top_k_(top_k) {}

void StepRouting::Add(int64_t layer, const at::Tensor& choices, const at::Tensor& prob_sums,
                      const at::Tensor& tokens, const at::Tensor& entropy_sum) {
  const auto it = std::find(sparse_layers_.begin(), sparse_layers_.end(), layer);
  TORCH_CHECK(it != sparse_layers_.end(), "StepRouting: layer ", layer, " is not sparse");
  const at::Tensor part =
      at::cat({choices.reshape({-1}).to(at::kDouble), prob_sums.to(at::kDouble),
               tokens.reshape({1}).to(at::kDouble), entropy_sum.reshape({1}).to(at::kDouble)});
  if (totals_.empty()) {
    for (size_t i = 0; i < sparse_layers_.size(); ++i) totals_.push_back(at::zeros_like(part));
  }
  totals_[it - sparse_layers_.begin()].add_(part);
}

at::Tensor StepRouting::Flat() const {
  if (totals_.empty()) {
    return at::zeros({static_cast<int64_t>(sparse_layers_.size()) * width()}, at::kDouble);
  }
  return at::cat(totals_);
}

void StepRouting::SetFlat(const at::Tensor& flat) { totals_ = flat.to(at::kDouble).split(width()); }

at::Tensor StepRouting::ExpertCounts(int64_t index) const {
  return totals_.at(index).narrow(0, 0, top_k_ * num_experts_).view({top_k_, num_experts_}).sum(0);
}

at::Tensor StepRouting::Tokens(int64_t index) const {
  return totals_.at(index)[(top_k_ + 1) * num_experts_];
}

std::vector<int64_t> StepRouting::LayersRoutedOtherwise(const StepRouting& other) const {
  TORCH_CHECK(other.sparse_layers_ == sparse_layers_ && other.width() == width(),
              "StepRouting: compared with the routing of another model");
  const int64_t ke = top_k_ * num_experts_;
  std::vector<int64_t> layers;
  const at::Tensor mine = Flat().cpu().view({-1, width()});
  const at::Tensor theirs = other.Flat().cpu().view({-1, width()});
  for (size_t l = 0; l < sparse_layers_.size(); ++l) {
    const at::Tensor a = mine[static_cast<int64_t>(l)];
    const at::Tensor b = theirs[static_cast<int64_t>(l)];
    if (!a.narrow(0, 0, ke).equal(b.narrow(0, 0, ke)) ||
        !a[ke + num_experts_].equal(b[ke + num_experts_])) {
      layers.push_back(sparse_layers_[l]);
    }
  }
  return layers;
}

double StepRouting::AuxLoss(AuxLossScope scope) const {
  if (totals_.empty()) return 0;
  const at::Tensor all = at::stack(totals_).cpu();  // (layers, width)
  const int64_t ke = top_k_ * num_experts_;
  const at::Tensor choices = all.narrow(1, 0, ke).view({-1, top_k_, num_experts_});
  const at::Tensor probs = all.narrow(1, ke, num_experts_);
  const at::Tensor tokens = all.select(1, ke + num_experts_);
  if (scope == AuxLossScope::kAllLayers) {
    return SwitchLoss(choices.sum(0), probs.sum(0), tokens.sum().item<double>());
  }
  double sum = 0;
  for (int64_t l = 0; l < all.size(0); ++l) {
    sum += SwitchLoss(choices[l], probs[l], tokens[l].item<double>());
  }
  return sum / static_cast<double>(all.size(0));
}

std::vector<LayerRouting> StepRouting::Layers() const {
  std::vector<LayerRouting> layers;
  if (totals_.empty()) return layers;
  const at::Tensor all = at::stack(totals_).cpu().contiguous();
  const int64_t ke = top_k_ * num_experts_;
  for (size_t l = 0; l < sparse_layers_.size(); ++l) {
    const at::Tensor row = all[static_cast<int64_t>(l)];
    const at::Tensor load = row.narrow(0, 0, ke).view({top_k_, num_experts_}).sum(0).contiguous();
    LayerRouting& r = layers.emplace_back();
    r.layer = sparse_layers_[l];
    r.load.assign(load.const_data_ptr<double>(), load.const_data_ptr<double>() + num_experts_);
    r.tokens = row[ke + num_experts_].item<double>();
    r.entropy_sum = row[ke + num_experts_ + 1].item<double>();
  }
  return layers;
}

}  // namespace ballast::train
