// CUDA implementation of kernels/causal_conv1d.h; callers go through
// causal_conv1d_silu(), which validates the arguments and wraps these in
// autograd. The contract is the CPU kernel's (kernels/cpu/
// causal_conv1d_cpu.h), for tensors on one CUDA device (cu_seqlens on the
// CPU); the kernels are the block programs of kernels/cuda/
// causal_conv1d_blocks.h. In a build without CUDA the entry points throw and
// causal_conv1d_cuda_supports() is false.
#ifndef BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_CUDA_H_
#define BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_CUDA_H_

#include <ATen/core/Tensor.h>

#include "kernels/cpu/causal_conv1d_cpu.h"

namespace ballast::kernels {

// Whether this build has the kernel and `device` is a CUDA device; where it is
// false, causal_conv1d_silu() takes the op-by-op path.
bool causal_conv1d_cuda_supports(const at::Device& device);

at::Tensor causal_conv1d_silu_cuda_forward(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& cu_seqlens,
                                           const at::Tensor& initial_window);

CausalConv1dGrads causal_conv1d_silu_cuda_backward(const at::Tensor& x, const at::Tensor& weight,
                                                   const at::Tensor& cu_seqlens,
                                                   const at::Tensor& initial_window,
                                                   const at::Tensor& dy);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_CUDA_H_
