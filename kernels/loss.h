// Losses that return (sum, count) so that the caller divides by a global
// count: the supervised tokens of the whole optimizer step, over all
// micro-batches and ranks. A per-chunk or per-micro-batch mean is wrong here.
#ifndef BALLAST_KERNELS_LOSS_H_
#define BALLAST_KERNELS_LOSS_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace ballast::kernels {

struct LossSum {
  // fp32 scalar (fp64 for fp64 inputs), differentiable: sum over counted tokens
  // of weight * loss.
  at::Tensor sum;
  // int64 scalar: number of targets != ignore_index (weights do not change it).
  at::Tensor count;
};

// Cross-entropy of logits = hidden @ weight^T, computed a block of rows at a
// time (on CUDA also in vocabulary tiles) so that the (T, V) logits are never
// materialised; the log-sum-exp is fp32. The upstream gradient is applied in
// fp32 before a bf16 / fp16 gradient is rounded, once (see kernels/loss.cc).
// fp32 inputs compute in IEEE fp32 on CUDA too, never TF32, whatever torch's
// global TF32 setting.
//   hidden         (T, H)  fp32 / bf16 / fp16, or fp64 (computed in fp64, for gradient checks)
//   weight         (V, H)  same dtype (the lm_head)
//   targets        (T)     int64, in [0, V) or ignore_index
//   token_weights  (T)     optional fp32 multiplier per token (e.g. 1/p_mask)
// loss_t = lse_t - logit_t[target_t] + z_loss * lse_t^2.
// Differentiable with respect to hidden and weight; ignored tokens get zero gradient.
// Throws c10::Error naming the argument on bad shapes, dtypes, devices or targets.
//
// counted: the number of targets != ignore_index when the caller knows it
// (a trainer counts them while packing), else -1. On CUDA it spares the two
// reads back to the host that checking and counting the targets take, so
// the host can queue the step ahead of the GPU; a target outside [0, V)
// then stops the process with a device-side assertion instead of a message.
// On CPU it is checked against the targets.
LossSum linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets,
                             const std::optional<at::Tensor>& token_weights = std::nullopt,
                             int64_t ignore_index = -100, double z_loss = 0.0,
                             int64_t counted = -1);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_LOSS_H_
