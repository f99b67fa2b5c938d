// CUDA implementation of kernels/attention.h; callers go through attention(),
// which validates arguments and wraps these in autograd. The mask arrives
// compiled to key intervals by interval_mask() (kernels/cpu/attention_cpu.h),
// the same structure the CPU kernel reads, so both backends mask identically.
//
// Supported: bf16 and fp16 inputs, head dim 64, 128 or 256, sm_80 or newer
// with 163 KiB of shared memory per block (A100, H100/H200, B200: sm_80, 90,
// 100). The tiles are sized for that; GPUs that allow 99 KiB (sm_86, 89, 120:
// A10, L4, L40S, RTX) get a c10::Error naming the bytes a kernel needs for
// the forward at D >= 128 and for the backward.
// fp32 and fp64 inputs, and other head dims, throw a c10::Error that says so;
// they run on CPU. In a build without CUDA every entry point throws.
#ifndef BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_
#define BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_

#include <ATen/core/Tensor.h>

#include "kernels/cpu/attention_cpu.h"

namespace ballast::kernels {

struct AttentionCudaForward {
  at::Tensor out;  // (T, Hq, D) in q's dtype.
  at::Tensor lse;  // (Hq, T) fp32 natural-log log-sum-exp; -inf for a row that sees no key.
};

struct AttentionCudaGrads {
  at::Tensor q;  // (T, Hq, D) in q's dtype.
  at::Tensor k;  // (T, Hkv, D), summed over the query heads of each kv head.
  at::Tensor v;  // (T, Hkv, D), likewise.
};

// q (T, Hq, D), k and v (T, Hkv, D) on one CUDA device, contiguous; mask's
// tensors on CPU. Runs on the current stream.
AttentionCudaForward attention_cuda_forward(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const IntervalMask& mask,
                                            double scale);

// grad_out (T, Hq, D), any layout; out and lse are the forward's. Rows with
// lse == -inf get gradient 0. Deterministic: no atomics.
AttentionCudaGrads attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                           const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& out, const at::Tensor& lse,
                                           const IntervalMask& mask, double scale);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_
