// CUDA implementation of kernels/loss.h linear_cross_entropy; callers go
// through linear_cross_entropy(), which validates arguments, finds the
// counted rows and wraps these in autograd. Same contract as the CPU backend
// (kernels/cpu/linear_cross_entropy_cpu.h), for tensors on one CUDA device.
// In a build without CUDA both throw, naming the missing backend.
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

// See linear_cross_entropy_cpu_forward: the same inputs and results, on CUDA.
LceForward linear_cross_entropy_cuda_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                             const at::Tensor& targets, const at::Tensor& rows,
                                             const at::Tensor& token_weights, double z_loss);

// See linear_cross_entropy_cpu_backward: the same inputs and results, on CUDA.
LceGrads linear_cross_entropy_cuda_backward(const at::Tensor& grad_sum, const at::Tensor& hidden,
                                            const at::Tensor& weight, const at::Tensor& targets,
                                            const at::Tensor& rows, const at::Tensor& token_weights,
                                            const at::Tensor& lse, double z_loss, bool need_hidden,
                                            bool need_weight);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_LINEAR_CROSS_ENTROPY_CUDA_H_
