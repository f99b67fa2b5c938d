// StepRouting: a Mixture-of-Experts step's routing, summed over its
// micro-batches and then over ranks: what global-batch balancing (arXiv
// 2501.11873, moe.aux_loss global) counts f and P over, what the step's aux
// loss is reported from, and what the metrics and the guard read
// (moe_step_stats.h).
//
// Per sparse layer l, over the step's counted tokens t (padding never, block
// diffusion's clean half x_0 neither: load_balancing.h):
//   choices_l[j, e]  tokens whose j-th choice is e          (k, E)
//   probs_l[e]       Σ_t p_t[e], p the router's softmax     (E)
//   tokens_l         counted tokens
//   entropy_l        Σ_t −Σ_e p_t[e] ln p_t[e]
// and the Switch loss of counts C (k, E), probability sums S (E) and N tokens
//   L(C, S, N) = E · Σ_{j,e} (C[j, e] / N) · (S[e] / N).
// Scope all_layers (transformers: the layers' logits concatenated over
// tokens) is L(Σ_l C_l, Σ_l S_l, Σ_l N_l); per_layer (Megatron) is
// mean_l L(C_l, S_l, N_l).
//
// Thread-compatible. The totals stay on the device they were added on until
// Flat() is reduced and read back once with the step's other sums.
#ifndef BALLAST_WORKER_TRAIN_MODEL_STEP_ROUTING_H_
#define BALLAST_WORKER_TRAIN_MODEL_STEP_ROUTING_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/train/model/moe_step_stats.h"

namespace ballast::train {

// moe.aux_loss_scope.
enum class AuxLossScope { kAllLayers, kPerLayer };

// The Switch loss E · Σ (C / N) · (S / N) of one set of counts, in float64
// (see the file comment); 0 when n is 0.
double SwitchLoss(const at::Tensor& choices, const at::Tensor& prob_sums, double tokens);

class StepRouting {
 public:
  // `sparse_layers`: the decoder indices of the MoE layers, in order.
  StepRouting(std::vector<int64_t> sparse_layers, int64_t num_experts, int64_t top_k);

  // Adds one forward's routing of sparse layer `layer` (a decoder index):
  // choices (k, E), prob_sums (E), and 0-dim tokens and entropy_sum, any
  // dtype, all on one device.
  void Add(int64_t layer, const at::Tensor& choices, const at::Tensor& prob_sums,
           const at::Tensor& tokens, const at::Tensor& entropy_sum);

  // Every total as one fp64 tensor, layer after layer (k·E + E + 2 values
  // each), for one SumInPlace over ranks; SetFlat takes the reduced one back.
  at::Tensor Flat() const;
  void SetFlat(const at::Tensor& flat);

  // Sparse layer `index`'s (into sparse_layers) tokens that chose each
  // expert, (E) fp64 summed over the choice slots, and its counted tokens
  // (0-dim fp64): f of global balancing, on the totals' device.
  at::Tensor ExpertCounts(int64_t index) const;
  at::Tensor Tokens(int64_t index) const;

  // The sparse layers (decoder indices) where `other`, a count of the same
  // step, has other choice counts or token counts than these totals: empty
  // when both routed every counted token alike.
  std::vector<int64_t> LayersRoutedOtherwise(const StepRouting& other) const;

  // The step's load-balancing loss from the totals (global f and P).
  double AuxLoss(AuxLossScope scope) const;
  // The totals as moe_step_stats.h reads them (on the host).
  std::vector<LayerRouting> Layers() const;

  const std::vector<int64_t>& sparse_layers() const { return sparse_layers_; }

 private:
  int64_t width() const { return (top_k_ + 1) * num_experts_ + 2; }

  std::vector<int64_t> sparse_layers_;
  int64_t num_experts_;
  int64_t top_k_;
  // Per sparse layer, fp64: choices (k·E) | prob_sums (E) | tokens | entropy.
  std::vector<at::Tensor> totals_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_STEP_ROUTING_H_
