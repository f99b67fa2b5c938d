// The SwiGLU gate of Llama/Qwen MLPs, on the gate and up projections made as
// one (T, 2I) product:
//   out = silu(gate) * up,   silu(g) = g / (1 + exp(-g)),   [gate, up] = gate_up
#ifndef BALLAST_KERNELS_SWIGLU_H_
#define BALLAST_KERNELS_SWIGLU_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// gate_up (T, 2I), any dtype and device; returns (T, I), differentiable in
// gate_up. fp32 on CPU runs one fused pass each way, and its backward writes
// the (T, 2I) gradient directly: op by op, the forward is two passes and the
// backward four plus the concatenation of the two halves' gradients. The fused
// pass computes HF's formulas element by element with the same operation
// order; only its exp differs from ATen's (both within 1e-7 relative of expf).
// Other dtypes and devices run ATen's silu and mul, whose reduced-precision
// rounding is HF's exactly.
at::Tensor swiglu(const at::Tensor& gate_up);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_SWIGLU_H_
