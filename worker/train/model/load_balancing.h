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

  // Layer `layer`'s routing of the forward's tokens: `selected` (T, k) int64,
  // each token's experts in top-k order, and `probs` (T, E) fp32, the router
  // softmax. Replaces an earlier record of the same layer.
  void Record(int64_t layer, const at::Tensor& selected, const at::Tensor& probs,
              const at::Tensor& logits);

  // transformers' aux_loss (without the coefficient) over every recorded
  // layer's tokens: a 0-dim fp32 tensor on the records' device, no graph.
  // 0 when nothing was recorded.
  at::Tensor AuxLoss() const;
  // w (E) fp32: the gradient of weight * AuxLoss() w.r.t. each token's router
  // probabilities, the same for every token and layer.
  at::Tensor ProbabilityGradient() const;

  double weight() const { return weight_; }
  int64_t num_experts() const { return num_experts_; }
  // Per layer, how often each expert was each token's k-th choice, (k, E)
  // int64; undefined for a layer that did not record.
  const std::vector<at::Tensor>& counts() const { return counts_; }
  // Per layer, (T, E) fp32 router logits when kept; undefined otherwise.
  const std::vector<at::Tensor>& router_logits() const { return logits_; }

 private:
  int64_t num_experts_;
  int64_t top_k_;
  double weight_;
  bool keep_logits_;
  std::vector<at::Tensor> counts_;      // per layer (k, E) int64
  std::vector<at::Tensor> prob_sums_;   // per layer (E) fp32: sum over tokens of p
  std::vector<int64_t> tokens_;         // per layer
  std::vector<at::Tensor> logits_;      // per layer (T, E), when kept
};

// `router_logits` (T, E) fp32 unchanged. In backward, the gradient of
// stats.weight() * stats.AuxLoss() w.r.t. them is added to what arrives
// (the softmax is recomputed from the saved logits). The graph keeps `stats`
// alive. Without grad mode, or with a weight of 0, it returns the logits.
at::Tensor BalanceRouterLogits(const at::Tensor& router_logits,
                               std::shared_ptr<const RoutingStats> stats);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_LOAD_BALANCING_H_
