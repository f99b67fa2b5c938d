#include "worker/train/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace ballast::train {

AdamW::AdamW(AdamWConfig config, const ParamStore& params) : config_(config) {
  for (const std::string& name : params.trainable_names()) {
    const at::Tensor& p = params.get(name);
    moments_[name] = {torch::zeros_like(p, torch::kFloat), torch::zeros_like(p, torch::kFloat)};
  }
}

void AdamW::step(const ParamStore& params, double lr) {
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

std::map<std::string, at::Tensor> AdamW::state_dict() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, m] : moments_) {
    out[name + ".exp_avg"] = m.exp_avg;
    out[name + ".exp_avg_sq"] = m.exp_avg_sq;
  }
  out["__step__"] = torch::tensor(steps_, torch::kLong);
  return out;
}

absl::Status AdamW::load_state_dict(const std::map<std::string, at::Tensor>& state) {
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

double ScheduledLearningRate(const std::string& kind, double base_lr, int64_t step,
                             int64_t warmup_steps, int64_t max_steps) {
  const double s = static_cast<double>(step);
  if (step < warmup_steps) return base_lr * s / std::max<int64_t>(1, warmup_steps);
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, max_steps - warmup_steps));
  if (kind == "linear") {
    return base_lr * std::max(0.0, static_cast<double>(max_steps - step) / decay_steps);
  }
  if (kind == "cosine") {
    const double progress = static_cast<double>(step - warmup_steps) / decay_steps;
    return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  }
  return base_lr;
}

}  // namespace ballast::train
