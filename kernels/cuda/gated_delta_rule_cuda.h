// CUDA implementation of kernels/gated_delta_rule.h; callers go through
// gated_delta_rule(), which validates the arguments and wraps these in
// autograd. The contract is the CPU kernel's (kernels/cpu/
// gated_delta_rule_cpu.h), for tensors on one CUDA device (cu_seqlens on the
// CPU); the kernels are the block programs of kernels/cuda/
// gated_delta_rule_blocks.h. In a build without CUDA the entry points throw
// and gated_delta_rule_cuda_supports() is false.
#ifndef BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_CUDA_H_
#define BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_CUDA_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/cpu/gated_delta_rule_cpu.h"

namespace ballast::kernels {

// Whether this build has the kernel and the device gives a block the shared
// memory it needs for key head dim dk (up to dk 128 on sm_80's 163 KiB, up
// to 256 on sm_90's 227 KiB). Where it is false, gated_delta_rule() takes the
// op-by-op path.
bool gated_delta_rule_cuda_supports(int64_t dk, const at::Device& device);

GdrForward gated_delta_rule_cuda_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& g,
                                         const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                         const at::Tensor& initial_state, double scale,
                                         double l2norm_eps);

GdrGrads gated_delta_rule_cuda_backward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                        const at::Tensor& chunk_states, const at::Tensor& d_out,
                                        const at::Tensor& d_final, double scale, double l2norm_eps);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_CUDA_H_
