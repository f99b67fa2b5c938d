#include "worker/train/optim/adamw.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ballast::train {

AdamW::AdamW(AdamWConfig config, const ParamStore& params) : config_(config) {
  for (const std::string& name : params.TrainableNames()) {
    const at::Tensor& p = params.get(name);
    moments_[name] = {torch::zeros_like(p, torch::kFloat), torch::zeros_like(p, torch::kFloat)};
  }
}

void AdamW::Step(const ParamStore& params, double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const double bias_correction1 = 1 - std::pow(config_.beta1, steps_);
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(config_.beta2, steps_));
  const double step_size = lr / bias_correction1;
  for (auto& [name, m] : moments_) {
    at::Tensor p = params.get(name);
    const at::Tensor& grad = p.grad();
    if (!grad.defined()) continue;
    p.mul_(1 - lr * config_.weight_decay);
    m.exp_avg.lerp_(grad, 1 - config_.beta1);
    m.exp_avg_sq.mul_(config_.beta2).addcmul_(grad, grad, 1 - config_.beta2);
    at::Tensor denom = (m.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(config_.eps);
    p.addcdiv_(m.exp_avg, denom, -step_size);
  }
}

std::map<std::string, at::Tensor> AdamW::StateDict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, m] : moments_) {
    out[name + ".exp_avg"] = m.exp_avg;
    out[name + ".exp_avg_sq"] = m.exp_avg_sq;
  }
  out["__step__"] = torch::tensor(steps_, torch::kLong);
  return out;
}

absl::Status AdamW::LoadStateDict(const std::map<std::string, at::Tensor>& state) {
  auto step = state.find("__step__");
  if (step == state.end()) return absl::DataLossError("optimizer state has no __step__");
  for (auto& [name, m] : moments_) {
    for (auto [suffix, dst] : {std::pair{".exp_avg", &m.exp_avg}, {".exp_avg_sq", &m.exp_avg_sq}}) {
      auto it = state.find(name + suffix);
      if (it == state.end() || it->second.sizes() != dst->sizes()) {
        return absl::DataLossError(
            absl::StrCat("optimizer state for ", name, suffix, " is missing or has another shape"));
      }
      dst->copy_(it->second);
    }
  }
  steps_ = step->second.item<int64_t>();
  return absl::OkStatus();
}

}  // namespace ballast::train
