#include "worker/train/guard/fault_injection.h"

#include <torch/torch.h>

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast::train {
namespace {

// The last tensor with an element: the same choice on every run and rank
// layout, and (LoRA's B, or the last layer) close to the loss.
const at::Tensor* LastNonEmpty(const std::vector<at::Tensor>& tensors) {
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    if (it->defined() && it->numel() > 0) return &*it;
  }
  return nullptr;
}

void WriteNaN(const at::Tensor& t) {
  torch::NoGradGuard no_grad;
  t.view(-1)[0].fill_(std::numeric_limits<double>::quiet_NaN());
}

}  // namespace

FaultInjection::FaultInjection(const v1::GuardInject& spec, int rank) : spec_(spec), rank_(rank) {}

std::string FaultInjection::Describe() const {
  std::vector<std::string> parts;
  const auto add = [&](const char* what, const google::protobuf::RepeatedField<int64_t>& steps) {
    if (!steps.empty())
      parts.push_back(absl::StrCat(what, " at steps ", absl::StrJoin(steps, ",")));
  };
  add("a NaN gradient", spec_.nan_grad_at_step());
  add("an infinite loss", spec_.inf_loss_at_step());
  add("a 1000x loss spike", spec_.spike_at_step());
  add("no supervised tokens", spec_.zero_tokens_at_steps());
  add("a NaN weight", spec_.nan_weight_at_step());
  if (parts.empty()) return "";
  return absl::StrCat(
      "guard.inject (a test of the guard, not training): ", absl::StrJoin(parts, "; "), " on rank ",
      spec_.on_rank(), spec_.transient() ? ", transient" : "");
}

void FaultInjection::BeginStep(int64_t step) {
  fresh_ = step > furthest_;
  furthest_ = std::max(furthest_, step);
}

bool FaultInjection::Fires(const google::protobuf::RepeatedField<int64_t>& steps, int64_t step,
                           bool rerun, bool this_rank_only) const {
  if (!fresh_ || (rerun && spec_.transient())) return false;
  if (this_rank_only && rank_ != spec_.on_rank()) return false;
  return std::find(steps.begin(), steps.end(), step) != steps.end();
}

void FaultInjection::MaskTargets(int64_t step, std::vector<PackedBatch>* batches) const {
  if (!Fires(spec_.zero_tokens_at_steps(), step, /*rerun=*/false, /*this_rank_only=*/false)) {
    return;
  }
  for (PackedBatch& b : *batches) {
    b.targets = torch::full_like(b.targets, -100);
    b.supervised_tokens = 0;
  }
}

double FaultInjection::LossFactor(int64_t step, bool rerun) const {
  if (Fires(spec_.inf_loss_at_step(), step, rerun, /*this_rank_only=*/true)) {
    return std::numeric_limits<double>::infinity();
  }
  if (Fires(spec_.spike_at_step(), step, rerun, /*this_rank_only=*/true)) return 1000;
  return 1;
}

void FaultInjection::PoisonGradient(int64_t step, bool rerun,
                                    const std::vector<at::Tensor>& grads) const {
  if (!Fires(spec_.nan_grad_at_step(), step, rerun, /*this_rank_only=*/true)) return;
  if (const at::Tensor* g = LastNonEmpty(grads)) WriteNaN(*g);
}

void FaultInjection::PoisonWeights(int64_t step, const ParamStore& trained) const {
  if (!Fires(spec_.nan_weight_at_step(), step, /*rerun=*/false, /*this_rank_only=*/true)) return;
  std::vector<at::Tensor> tensors;
  for (const std::string& name : trained.TrainableNames()) tensors.push_back(trained.get(name));
  if (const at::Tensor* t = LastNonEmpty(tensors)) WriteNaN(*t);
}

}  // namespace ballast::train
