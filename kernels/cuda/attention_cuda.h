// CUDA implementation of kernels/attention.h; callers go through attention(),
// which validates arguments, picks the implementation and tiles
// (choose_attention_kernel, kernels/attention_tiles.h) and wraps these in
// autograd. The mask arrives as the batch's MaskPlan (kernels/attention_plan.h):
// the key intervals of interval_mask(), the structure the CPU kernel reads, so
// both backends mask identically, with its tile lists already on the device.
//
// Supported: bf16 and fp16 inputs, head dim 64, 128 or 256, sm_80 or newer,
// the tiles given being compiled variants that fit the device's shared
// memory. In a build without CUDA every entry point throws.
#ifndef BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_
#define BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_

#include <ATen/core/Tensor.h>

#include "kernels/attention_plan.h"
#include "kernels/attention_tiles.h"

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

// What the current CUDA device offers, for choose_attention_kernel; its
// shared-memory limit is lowered to BALLAST_ATTENTION_SMEM_LIMIT (bytes) when
// that is set, so that the small tiles can be run on a large GPU.
DeviceCaps attention_device_caps(const at::Device& device);

// q (T, Hq, D), k and v (T, Hkv, D) on one CUDA device, any layout (copied
// when not contiguous or not 16-byte aligned); `tile` the forward's variant.
// Runs on the current stream.
AttentionCudaForward attention_cuda_forward(const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, MaskPlan& plan, TileShape tile,
                                            double scale);

// grad_out (T, Hq, D), any layout (an expanded one included); out and lse are
// the forward's. Rows with lse == -inf get gradient 0. Deterministic: no
// atomics.
AttentionCudaGrads attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                           const at::Tensor& k, const at::Tensor& v,
                                           const at::Tensor& out, const at::Tensor& lse,
                                           MaskPlan& plan, TileShape dq_tile, TileShape dkv_tile,
                                           double scale);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_ATTENTION_CUDA_H_
