// CUDA implementation of kernels/loss.h linear_cross_entropy; callers go
// through linear_cross_entropy(), which validates arguments, finds the
// counted rows and wraps these in autograd. Same contract as the CPU backend
// (kernels/cpu/linear_cross_entropy_cpu.h), for tensors on one CUDA device.
// In a build without CUDA both throw, naming the missing backend.
//
// fp32 inputs are multiplied in IEEE fp32 on CUDA, never TF32, whatever
// torch's global allow_tf32 / float32_matmul_precision says: the precision is
// the inputs' dtype, as on the CPU.
#ifndef BALLAST_KERNELS_CUDA_LINEAR_CROSS_ENTROPY_CUDA_H_
#define BALLAST_KERNELS_CUDA_LINEAR_CROSS_ENTROPY_CUDA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/cpu/linear_cross_entropy_cpu.h"

namespace ballast::kernels {

// Tile of the logits that exists at any time on the GPU: kLceCudaChunkRows
// counted tokens by kLceCudaChunkVocab vocabulary entries, 128 MiB in fp32.
// Larger than the CPU's tile because cuBLAS needs large products to fill the
// device; the result does not depend on the tiling beyond rounding.
inline constexpr int64_t kLceCudaChunkRows = 4096;
inline constexpr int64_t kLceCudaChunkVocab = 8192;

struct LceForward {
  // Scalar: sum over counted rows of token_weight * loss; fp32 (fp64 for fp64 inputs).
  at::Tensor sum;
  // (T_c) log-sum-exp of each counted row, in the compute dtype, for the backward.
  at::Tensor lse;
};

// The loss of linear_cross_entropy_cpu, on CUDA, with the log-sum-exp that the
// backward needs.
LceForward linear_cross_entropy_cuda_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, const at::Tensor& rows,
                                             const at::Tensor& token_weights, double z_loss);

// The gradients of linear_cross_entropy_cpu for an upstream gradient
// grad_sum (a scalar), on CUDA, in the inputs' dtype. grad_sum enters the
// fp32 per-row coefficients before anything is rounded, and each gradient is
// rounded to the input dtype once, at the end. Unlike the CPU backend this
// recomputes the logits; on the GPU the fourth product is cheaper than
// holding whole rows. Runs in the autograd backward (kernels/loss.cc).
LceGrads linear_cross_entropy_cuda_backward(const at::Tensor& grad_sum, const at::Tensor& hidden,
                                            const at::Tensor& weight, const at::Tensor& targets,
                                            const at::Tensor& rows, const at::Tensor& token_weights,
                                            const at::Tensor& lse, double z_loss, bool need_hidden,
                                            bool need_weight);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_LINEAR_CROSS_ENTROPY_CUDA_H_
