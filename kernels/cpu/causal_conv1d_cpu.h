// CPU implementation of kernels/causal_conv1d.h: the forward and backward that
// the autograd wrapper in kernels/causal_conv1d.cc calls. causal_conv1d_silu()
// validates the arguments; nothing here checks them again.
//
//   x (T, C) fp32 or bf16, unit stride in C; weight (C, K); cu_seqlens int64
//   (N + 1); initial_window (N, C, K - 1) or undefined.
#ifndef BALLAST_KERNELS_CPU_CAUSAL_CONV1D_CPU_H_
#define BALLAST_KERNELS_CPU_CAUSAL_CONV1D_CPU_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// y (T, C) in x's dtype.
at::Tensor causal_conv1d_silu_cpu_forward(const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& cu_seqlens,
                                          const at::Tensor& initial_window);

struct CausalConv1dGrads {
  at::Tensor d_x;       // (T, C) x's dtype
  at::Tensor d_weight;  // (C, K) weight's dtype
  at::Tensor d_window;  // (N, C, K - 1) the window's dtype, undefined without a window
};

// dy (T, C) any float dtype.
CausalConv1dGrads causal_conv1d_silu_cpu_backward(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& cu_seqlens,
                                                  const at::Tensor& initial_window,
                                                  const at::Tensor& dy);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_CAUSAL_CONV1D_CPU_H_
