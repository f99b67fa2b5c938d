// RMSNorm as HF's Llama, Qwen2 and Qwen3 compute it:
//   n = x / sqrt(mean(x^2 over the last dim) + eps)   in fp32
//   y = weight * n                                    n rounded to x's dtype first
// and Qwen3.5's zero-centred form (Qwen3_5RMSNorm, weight initialised to 0):
//   y = n * (1 + weight)                              in fp32, rounded once
#ifndef BALLAST_KERNELS_RMS_NORM_H_
#define BALLAST_KERNELS_RMS_NORM_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// x (..., H) with unit stride in H (any other strides, so that q and k can be
// normalised per head straight from the fused q/k/v projection); weight (H).
// Returns a contiguous tensor of x's sizes and dtype, differentiable in x and
// weight.
//
// fp32 on CPU runs one fused pass each way: the op-by-op graph keeps n and
// runs eight elementwise and reduction passes backward. The backward is
//   dn = dy * weight,   dx = r (dn - n mean(dn * n)),   dweight = sum_rows dy * n
// with r = 1 / sqrt(mean(x^2) + eps) saved per row by the forward; dweight
// is summed over fixed blocks of rows in a fixed order, so it does not depend
// on the thread count. Other dtypes and devices run ATen's ops, with HF's
// roundings exactly.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The zero-centred form, with rms_norm's arguments and result. fp32 on CPU is
// rms_norm's fused pass with 1 + weight as its weight: in fp32 the products
// are HF's, and the gradient reaches weight through the sum. Other dtypes
// and devices run ATen's ops: n and 1 + weight in fp32, one rounding.
at::Tensor rms_norm_zero_centred(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_RMS_NORM_H_
