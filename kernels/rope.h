// Rotary position embedding in HF's rotate-half form (apply_rotary_pos_emb in
// transformers' Llama, Qwen2, Qwen3 and Qwen3.5):
//   out = x * cos + rotate_half(x) * sin,   rotate_half([x1, x2]) = [-x2, x1]
// with x1, x2 the two halves of the rotated dimensions. Partial RoPE
// (Qwen3.5: partial_rotary_factor) rotates the first R = cos.size(1) channels
// of each head this way and passes the other D - R through unchanged.
#ifndef BALLAST_KERNELS_ROPE_H_
#define BALLAST_KERNELS_ROPE_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// x (T, heads, D) fp32 or bf16, any row and head strides with unit stride in
// D; cos and sin (T, R), R even and <= D (R = D: the whole head), in x's
// dtype, on x's device (CPU or CUDA). Returns a
// contiguous (T, heads, D) in x's dtype, differentiable in x. On CPU forward
// and backward are each one pass (the composite formula is five ops forward
// and four backward); on CUDA the formula runs as ATen ops. Either way each
// element is computed in fp32 and rounded once, so in bf16 it is within a
// rounding of HF's op-by-op result rather than bitwise equal.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_ROPE_H_
