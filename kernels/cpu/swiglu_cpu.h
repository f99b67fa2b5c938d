// CPU implementation of kernels/swiglu.h for fp32; swiglu() validates
// arguments and wraps these in autograd. Nothing here checks them again.
#ifndef BALLAST_KERNELS_CPU_SWIGLU_CPU_H_
#define BALLAST_KERNELS_CPU_SWIGLU_CPU_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// gate_up (T, 2I) fp32 with unit stride in its last dimension; returns a
// contiguous (T, I).
at::Tensor swiglu_cpu_forward(const at::Tensor& gate_up);

// d_out (T, I) with unit stride in its last dimension; returns a contiguous
// (T, 2I) gradient for gate_up.
at::Tensor swiglu_cpu_backward(const at::Tensor& gate_up, const at::Tensor& d_out);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_SWIGLU_CPU_H_
