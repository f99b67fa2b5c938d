// CPU implementation of kernels/loss.h linear_cross_entropy; callers go
// through linear_cross_entropy(), which validates arguments and wraps these in
// autograd. Nothing here checks shapes or dtypes again.
#ifndef BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_
#define BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::kernels {

// Tile of the logits that exists at any time: kLceChunkRows counted tokens by
// kLceChunkVocab vocabulary entries, 32 MiB in fp32.
inline constexpr int64_t kLceChunkRows = 1024;
inline constexpr int64_t kLceChunkVocab = 8192;

struct LceForward {
  // Scalar: sum over counted rows of token_weight * loss; fp32 (fp64 for fp64 inputs).
  at::Tensor sum;
  // (T_c) log-sum-exp of each counted row, in the compute dtype, for the backward.
  at::Tensor lse;
};

// rows (T_c) int64: positions of the counted tokens (target != ignore_index),
// increasing. token_weights may be undefined (all ones).
LceForward linear_cross_entropy_cpu_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, const at::Tensor& rows,
                                            const at::Tensor& token_weights, double z_loss);

struct LceGrads {
  at::Tensor hidden;  // (T, H) hidden's dtype, zero on ignored rows; undefined unless asked for.
  at::Tensor weight;  // (V, H) weight's dtype; undefined unless asked for.
};

// grad_sum is the scalar gradient of the loss sum; lse is the forward's.
LceGrads linear_cross_entropy_cpu_backward(const at::Tensor& grad_sum, const at::Tensor& hidden,
                                           const at::Tensor& weight, const at::Tensor& targets,
                                           const at::Tensor& rows, const at::Tensor& token_weights,
                                           const at::Tensor& lse, double z_loss, bool need_hidden,
                                           bool need_weight);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_LINEAR_CROSS_ENTROPY_CPU_H_
