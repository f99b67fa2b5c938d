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
                            std::shared_ptr<const RoutingStats> stats, int64_t layer) {
    ctx->save_for_backward({logits});
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["stats"] =
        c10::IValue::make_capsule(c10::make_intrusive<StatsCapsule>(std::move(stats)));
    // An alias would share the input's autograd identity; the output is a
    // tensor of its own, as any other op's.
    return logits.clone();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const at::Tensor logits = ctx->get_saved_variables()[0];
    const auto holder =
        c10::static_intrusive_pointer_cast<StatsCapsule>(ctx->saved_data["stats"].toCapsule());
    const RoutingStats& stats = *holder->stats;
    const at::Tensor w =
        stats.ProbabilityGradient(ctx->saved_data["layer"].toInt()).to(logits.options());  // (E)
    const at::Tensor p = at::softmax(logits, -1);                                          // (T, E)
    const at::Tensor mean_w = at::matmul(p, w).unsqueeze(1);                               // (T, 1)
    at::Tensor grad = p * (w.unsqueeze(0) - mean_w);
    if (stats.counted().defined()) grad = grad * stats.counted().unsqueeze(1).to(grad.dtype());
    if (grad_out[0].defined()) grad = grad + grad_out[0];
    return {grad, at::Tensor(), at::Tensor()};
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
      logits_(num_layers),
      entropy_sums_(num_layers) {}

void RoutingStats::set_counted(at::Tensor counted, int64_t count) {
  counted_ = std::move(counted);
  counted_count_ = count;
}

void RoutingStats::UseStepCounts(const StepRouting& step) {
  step_counts_.assign(counts_.size(), at::Tensor());
  step_tokens_.assign(counts_.size(), at::Tensor());
  for (size_t i = 0; i < step.sparse_layers().size(); ++i) {
    step_counts_[step.sparse_layers()[i]] = step.ExpertCounts(static_cast<int64_t>(i));
    step_tokens_[step.sparse_layers()[i]] = step.Tokens(static_cast<int64_t>(i));
  }
}

void RoutingStats::AddTo(StepRouting* step) const {
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (!counts_[i].defined()) continue;
    step->Add(static_cast<int64_t>(i), counts_[i], prob_sums_[i],
              at::scalar_tensor(static_cast<double>(tokens_[i]), at::kDouble), entropy_sums_[i]);
  }
}

std::vector<int64_t> RoutingStats::RecordedLayers() const {
  std::vector<int64_t> layers;
  for (size_t i = 0; i < counts_.size(); ++i) {
    if (counts_[i].defined()) layers.push_back(static_cast<int64_t>(i));
  }
  return layers;
}

void RoutingStats::Record(int64_t layer, const at::Tensor& all_selected,
                          const at::Tensor& all_probs, const at::Tensor& logits) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(layer >= 0 && layer < static_cast<int64_t>(counts_.size()), "RoutingStats: layer ",
              layer, " out of range");
  const at::Tensor selected = counted_.defined() ? all_selected.index({counted_}) : all_selected;
  const at::Tensor probs = counted_.defined() ? all_probs.index({counted_}) : all_probs;
  // counts[j, e] = tokens whose j-th choice is e: one scatter over the flat (k, E).
  const at::Tensor slot_offsets =
      torch::arange(top_k_, selected.options()).mul_(num_experts_).unsqueeze(0);  // (1, k)
  const at::Tensor flat = (selected + slot_offsets).reshape({-1});
  counts_[layer] = at::zeros({top_k_ * num_experts_}, selected.options())
                       .index_add_(0, flat, at::ones_like(flat))
                       .view({top_k_, num_experts_});
  prob_sums_[layer] = probs.detach().sum(0);
  entropy_sums_[layer] = at::special_entr(probs.detach()).sum();
  tokens_[layer] = counted_.defined() ? counted_count_ : probs.size(0);
  if (keep_logits_) logits_[layer] = logits.detach().clone();
}

at::Tensor RoutingStats::AuxLoss() const {
  torch::NoGradGuard no_grad;
  const std::vector<int64_t> recorded = RecordedLayers();
  if (recorded.empty()) return torch::zeros({}, torch::kFloat);
  StepRouting own(recorded, num_experts_, top_k_);
  AddTo(&own);
  // In the records' dtype: fp32 in training, fp64 in the float64 checks.
  return at::scalar_tensor(own.AuxLoss(scope_), prob_sums_[recorded.front()].options());
}

at::Tensor RoutingStats::ProbabilityGradient(int64_t layer) const {
  torch::NoGradGuard no_grad;
  const bool step = !step_counts_.empty();
  const std::vector<int64_t> recorded = RecordedLayers();
  const bool per_layer = scope_ == AuxLossScope::kPerLayer;
  // The counts (E, summed over the choice slots) and tokens of the layers the
  // loss term spans: the step's under global balancing, else this forward's.
  at::Tensor per_expert, tokens;
  for (int64_t l : per_layer ? std::vector<int64_t>{layer} : recorded) {
    const at::Tensor c = step ? step_counts_[l] : counts_[l].sum(0).to(at::kDouble);
    const at::Tensor t =
        step ? step_tokens_[l] : at::scalar_tensor(static_cast<double>(tokens_[l]), c.options());
    per_expert = per_expert.defined() ? per_expert + c : c;
    tokens = tokens.defined() ? tokens + t : t;
  }
  if (!per_expert.defined()) return at::zeros({num_experts_}, at::kFloat);
  const at::ScalarType dtype = prob_sums_[recorded.front()].scalar_type();
  // d/dP[e] of weight * E * sum_k f[k, e] P[e], times dP[e]/dp[t, e] = 1 / tokens;
  // per layer, the mean over the recorded layers divides by their number too.
  const double layers = per_layer ? static_cast<double>(recorded.size()) : 1.0;
  const at::Tensor t = tokens.clamp_min(1);
  return (per_expert * (weight_ * static_cast<double>(num_experts_) / layers) / (t * t)).to(dtype);
}

at::Tensor BalanceRouterLogits(const at::Tensor& router_logits,
                               std::shared_ptr<const RoutingStats> stats, int64_t layer) {
  if (!torch::GradMode::is_enabled() || !router_logits.requires_grad() || stats == nullptr ||
      stats->weight() == 0) {
    return router_logits;
  }
  return BalanceFunction::apply(router_logits, std::move(stats), layer);
}

}  // namespace ballast::train
