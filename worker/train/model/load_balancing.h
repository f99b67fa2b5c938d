// Load balancing of a mixture of experts: the auxiliary loss that keeps a
// router from sending every token to the same few experts, in the Switch form
// transformers computes for Qwen3-MoE (load_balancing_loss_func, 4.57.6):
//
//   the router logits of every sparse layer, concatenated over tokens;
//   p = softmax(logits) (T_all, E);  f[k, e] = share of tokens whose k-th choice is e;
//   P[e] = mean over tokens of p[:, e];  aux = E * sum_{k,e} f[k, e] * P[e]
//
// and the objective gains weight * aux (weight: router_aux_loss_coef over the
// step's micro-batches, in micro_batch scope). Only P carries a gradient (f
// comes from a top-k), and it is the same for every token of every layer:
//   d(weight * aux) / d p[t, e] = w[e] = weight * E * sum_k f[k, e] / T_all,
// so through the softmax  d/d logits[t] = p[t] * (w - <p[t], w>).
// Scope per_layer (Megatron; moe.aux_loss_scope) is the mean over the L
// recorded layers of each layer's loss: w_l[e] = weight * E * sum_k f_l[k, e]
// / (L * T_l), layer by layer.
//
// Global balancing (moe.aux_loss global, step_routing.h): UseStepCounts
// replaces this forward's f and T by the whole step's (all micro-batches and
// ranks); the same w summed over the step's forwards is then the gradient of
// the step's one loss, with weight = router_aux_loss_coef.
//
// Counted tokens (set_counted): the objective's BalancedTokens (block
// diffusion: the noisy half); the others neither count in f and P nor get
// the gradient.
//
// The layers do not return their logits (activation checkpointing and the
// sharded model run a layer inside an autograd function whose only output is
// its hidden states), so the loss is not built as a graph: each sparse layer
// records its routing here during the forward, and passes its logits through
// BalanceRouterLogits, an identity whose backward adds the gradient above. By
// backward time every layer has recorded, so w is known. A layer that runs
// twice (recomputed in backward under checkpointing) replaces its record,
// so nothing is counted twice. The loss's value comes from the records.
//
// The forward has no padding (packed rows), so every token counts, prompt
// tokens too (transformers leaves out only attention_mask 0).
//
// Thread-compatible: one forward records into one RoutingStats.
#ifndef BALLAST_WORKER_TRAIN_MODEL_LOAD_BALANCING_H_
#define BALLAST_WORKER_TRAIN_MODEL_LOAD_BALANCING_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/train/model/step_routing.h"

namespace ballast::train {

// One forward's routing, layer by layer, and its load-balancing loss.
class RoutingStats {
 public:
  // `num_layers` bounds the layer indices that record; `weight` multiplies
  // the loss whose gradient BalanceRouterLogits adds (0: none is added, and
  // the records only measure). `keep_logits` keeps each layer's router
  // logits too (router_logits()), for parity checks.
  RoutingStats(int64_t num_layers, int64_t num_experts, int64_t top_k, double weight,
               bool keep_logits = false);

  // The tokens that count, (T) bool, and how many are true; undefined: all.
  // Set before the forward.
  void set_counted(at::Tensor counted, int64_t count);
  // moe.aux_loss_scope; all_layers until set.
  void set_scope(AuxLossScope scope) { scope_ = scope; }
  // Global balancing: f and T of the gradient are `step`'s, the whole
  // step's reduced totals, from now on (before the backward).
  void UseStepCounts(const StepRouting& step);
  // Adds the records to the step's totals.
  void AddTo(StepRouting* step) const;

  // Layer `layer`'s routing of the forward's tokens: `selected` (T, k) int64,
  // each token's experts in top-k order, and `probs` (T, E) fp32, the router
  // softmax; only the counted tokens are kept. Replaces an earlier record of
  // the same layer.
  void Record(int64_t layer, const at::Tensor& selected, const at::Tensor& probs,
              const at::Tensor& logits);

  // transformers' aux_loss (without the coefficient) over every recorded
  // layer's tokens: a 0-dim fp32 tensor on the records' device, no graph.
  // 0 when nothing was recorded.
  at::Tensor AuxLoss() const;
  // w (E) fp32: the gradient of weight * the loss (the scope's; the step's
  // under global balancing) w.r.t. each counted token's router probabilities
  // in layer `layer`.
  at::Tensor ProbabilityGradient(int64_t layer) const;

  double weight() const { return weight_; }
  int64_t num_experts() const { return num_experts_; }
  // Per layer, how often each expert was each token's k-th choice, (k, E)
  // int64; undefined for a layer that did not record.
  const std::vector<at::Tensor>& counts() const { return counts_; }
  // Per layer, (T, E) fp32 router logits when kept; undefined otherwise.
  const std::vector<at::Tensor>& router_logits() const { return logits_; }

  // Per layer: Σ over counted tokens of p (E) fp32, and of the router's
  // entropy −Σ_e p ln p (0-dim fp32); undefined for a layer that did not record.
  const std::vector<at::Tensor>& prob_sums() const { return prob_sums_; }
  const std::vector<at::Tensor>& entropy_sums() const { return entropy_sums_; }
  const at::Tensor& counted() const { return counted_; }

 private:
  // The layers that recorded, in order.
  std::vector<int64_t> RecordedLayers() const;

  int64_t num_experts_;
  int64_t top_k_;
  double weight_;
  bool keep_logits_;
  std::vector<at::Tensor> counts_;        // per layer (k, E) int64
  std::vector<at::Tensor> prob_sums_;     // per layer (E) fp32: sum over tokens of p
  std::vector<int64_t> tokens_;           // per layer
  std::vector<at::Tensor> entropy_sums_;  // per layer, 0-dim
  AuxLossScope scope_ = AuxLossScope::kAllLayers;
  at::Tensor counted_;  // (T) bool, or undefined: every token
  int64_t counted_count_ = 0;
  // Global balancing: the step's per-layer expert counts (E, summed over
  // the choice slots) and tokens (0-dim), fp64; empty: this forward's own.
  std::vector<at::Tensor> step_counts_, step_tokens_;
  std::vector<at::Tensor> logits_;  // per layer (T, E), when kept
};

// `router_logits` (T, E) fp32 unchanged. In backward, the gradient of
// stats.weight() * stats.AuxLoss() w.r.t. them is added to what arrives
// (the softmax is recomputed from the saved logits). The graph keeps `stats`
// alive. Without grad mode, or with a weight of 0, it returns the logits.
at::Tensor BalanceRouterLogits(const at::Tensor& router_logits,
                               std::shared_ptr<const RoutingStats> stats, int64_t layer);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_LOAD_BALANCING_H_
