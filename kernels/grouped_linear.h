// grouped_linear: the experts' linear projection of a Mixture-of-Experts
// layer, dropless, over rows already sorted by expert (kernels/expert_order.h
// makes that order).
//
// Rows [offsets[e-1], offsets[e]) of x (offsets[-1] = 0) go through expert e:
//   y_i = x_i . weight[e]^T
//   x (N, in), weight (E, out, in), offsets (E,) int32 cumulative row ends on
//   x's device, non-decreasing, offsets[E-1] == N. Returns (N, out) in x's
//   dtype. Empty segments are allowed: no row goes through that expert.
//
// Differentiable in x and weight. The backward is the same grouped product:
//   dx_i      = dy_i . weight[e]
//   dweight_e = dy_e^T . x_e      (zero for an expert with no rows)
// float32 and bfloat16 (fp32 accumulation; bf16 results rounded once), and
// float64 on CPU, so that float64 reference models can run the same layer.
// Throws c10::Error naming the argument when shapes, dtypes, devices or (on
// CPU) the offsets' values are wrong; on CUDA the offsets' values are not read
// on the host, which would cost a synchronisation per call.
//
// Implementations: on CPU the threaded kernel of kernels/cpu/
// grouped_linear_cpu.h; on CUDA ATen's grouped GEMM (kernels/cuda/
// grouped_linear_cuda.h).
#ifndef BALLAST_KERNELS_GROUPED_LINEAR_H_
#define BALLAST_KERNELS_GROUPED_LINEAR_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& offsets);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_GROUPED_LINEAR_H_
