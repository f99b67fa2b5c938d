#include "worker/train/model/load_balancing.h"

#include <torch/torch.h>

#include <utility>

namespace ballast::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Carries the stats through autograd's saved data (an IValue capsule), so
// that the graph, not the caller, keeps them alive until backward.
struct StatsCapsule : torch::CustomClassHolder {
  explicit StatsCapsule(std::shared_ptr<const RoutingStats> s) : stats(std::move(s)) {}
  std::shared_ptr<const RoutingStats> stats;
};

struct BalanceFunction : public torch::autograd::Function<BalanceFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            std::shared_ptr<const RoutingStats> stats) {
    ctx->save_for_backward({logits});
    ctx->saved_data["stats"] = c10::IValue::make_capsule(
        c10::make_intrusive<StatsCapsule>(std::move(stats)));
    // An alias would share the input's autograd identity; the output is a
    // tensor of its own, as any other op's.
    return logits.clone();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const at::Tensor logits = ctx->get_saved_variables()[0];
    const auto holder = c10::static_intrusive_pointer_cast<StatsCapsule>(
        ctx->saved_data["stats"].toCapsule());
    const at::Tensor w = holder->stats->ProbabilityGradient().to(logits.options());  // (E)
    const at::Tensor p = at::softmax(logits, -1);                                       // (T, E)
    const at::Tensor mean_w = at::matmul(p, w).unsqueeze(1);                          // (T, 1)
    at::Tensor grad = p * (w.unsqueeze(0) - mean_w);
    if (grad_out[0].defined()) grad = grad + grad_out[0];
    return {grad, at::Tensor()};
  }
};

}  // namespace

RoutingStats::RoutingStats(int64_t num_layers, int64_t num_experts, int64_t top_k, double weight,
                           bool keep_logits)
    : num_experts_(num_experts),
      top_k_(top_k),
      weight_(weight),
      keep_logits_(keep_logits),
      counts_(num_layers),
      prob_sums_(num_layers),
      tokens_(num_layers, 0),
      logits_(num_layers) {}

void RoutingStats::Record(int64_t layer, const at::Tensor& selected, const at::Tensor& probs,
                          const at::Tensor& logits) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(counts_.size()),
              "RoutingStats: layer ", layer, " out of range");
  // counts[j, e] = tokens whose j-th choice is e: one scatter over the flat (k, E).
  const at::Tensor slot_offsets =
      torch::arange(top_k_, selected.options()).mul_(num_experts_).unsqueeze(0);  // (1, k)
  const at::Tensor flat = (selected + slot_offsets).reshape({-1});
  counts_[layer] = at::zeros({top_k_ * num_experts_}, selected.options())
                       .index_add_(0, flat, at::ones_like(flat))
                       .view({top_k_, num_experts_});
  prob_sums_[layer] = probs.detach().sum(0);
  tokens_[layer] = probs.size(0);
  if (keep_logits_) logits_[layer] = logits.detach().clone();
}

at::Tensor RoutingStats::AuxLoss() const {
  torch::NoGradGuard no_grad;
  at::Tensor counts, prob_sums;
  int64_t tokens = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (!counts_[i].defined()) continue;
    counts = counts.defined() ? counts + counts_[i] : counts_[i];
    prob_sums = prob_sums.defined() ? prob_sums + prob_sums_[i] : prob_sums_[i];
    tokens += tokens_[i];
  }
  if (tokens == 0) return torch::zeros({}, torch::kFloat);
  // f (k, E) and P (E) are means over every layer's tokens.
  const at::Tensor f = counts.to(prob_sums.scalar_type()) / static_cast<double>(tokens);
  const at::Tensor p = prob_sums / static_cast<double>(tokens);
  return (f * p.unsqueeze(0)).sum() * static_cast<double>(num_experts_);
}

at::Tensor RoutingStats::ProbabilityGradient() const {
  torch::NoGradGuard no_grad;
  at::Tensor per_expert;  // sum over layers and choice slots of the counts, (E)
  at::ScalarType dtype = torch::kFloat;
  int64_t tokens = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (!counts_[i].defined()) continue;
    const at::Tensor c = counts_[i].sum(0);
    per_expert = per_expert.defined() ? per_expert + c : c;
    dtype = prob_sums_[i].scalar_type();
    tokens += tokens_[i];
  }
  if (tokens == 0) return torch::zeros({num_experts_}, torch::kFloat);
  // d/dP[e] of weight * E * sum_k f[k, e] P[e], times dP[e]/dp[t, e] = 1 / tokens.
  const double t = static_cast<double>(tokens);
  return per_expert.to(dtype) * (weight_ * static_cast<double>(num_experts_) / (t * t));
}

at::Tensor BalanceRouterLogits(const at::Tensor& router_logits,
                               std::shared_ptr<const RoutingStats> stats) {
  if (!torch::GradMode::is_enabled() || !router_logits.requires_grad() || stats == nullptr ||
      stats->weight() == 0) {
    return router_logits;
  }
  return BalanceFunction::apply(router_logits, std::move(stats));
}

}  // namespace ballast::train
