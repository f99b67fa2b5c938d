// CPU implementation of kernels/rms_norm.h for fp32; rms_norm() validates
// arguments and wraps these in autograd. Nothing here checks them again.
#ifndef BALLAST_KERNELS_CPU_RMS_NORM_CPU_H_
#define BALLAST_KERNELS_CPU_RMS_NORM_CPU_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

struct RmsNormForward {
  at::Tensor y;     // (rows, H) contiguous
  at::Tensor rstd;  // (rows) fp32: 1 / sqrt(mean(x^2) + eps)
};

// x (T, G, H) fp32 with unit stride in H (rows are (t, g) in order).
RmsNormForward rms_norm_cpu_forward(const at::Tensor& x, const at::Tensor& weight, double eps);

struct RmsNormGrads {
  at::Tensor d_x;       // (rows, H) contiguous
  at::Tensor d_weight;  // (H), undefined unless asked for
};

// dy (rows, H) contiguous.
RmsNormGrads rms_norm_cpu_backward(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& rstd, const at::Tensor& dy,
                                   bool need_weight_grad);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_RMS_NORM_CPU_H_
