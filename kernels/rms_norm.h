// RMSNorm as HF's Llama, Qwen2 and Qwen3 compute it:
//   n = x / sqrt(mean(x^2 over the last dim) + eps)   in fp32
//   y = weight * n                                    n rounded to x's dtype first
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

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_RMS_NORM_H_
