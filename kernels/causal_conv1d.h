// causal_conv1d: the depthwise causal convolution of Gated DeltaNet (and
// Mamba), then SiLU, on packed variable-length batches:
//   y[t, c] = silu( sum_{j < K} w[c, j] x[t - (K - 1) + j, c] )
// where x before a document's first token is the document's initial window
// (zeros when none is given), never the previous document's tokens: the
// window restarts at every boundary, so a packed row equals its documents
// run one by one (transformers' torch fallback convolves across the whole
// row). No bias: Qwen3.5's conv1d has none.
//
//   x               (T, C) fp32 or bf16, unit stride in C
//   weight          (C, K) the conv1d weight [C, 1, K] squeezed, x's dtype or fp32
//   cu_seqlens      int64 (N + 1) on CPU, as in attention.h
//   initial_window  (N, C, K - 1) the K - 1 inputs before each document, or undefined
//   y               (T, C) x's dtype, computed in fp32
// Differentiable in x, weight and initial_window. Throws c10::Error naming the
// argument on inconsistent shapes.
//
// Implementations: on CPU the hand-written kernel (kernels/cpu/
// causal_conv1d_cpu.h); on CUDA the kernel of kernels/cuda/
// causal_conv1d_cuda.h where the build has it; elsewhere the op-by-op path
// below.
#ifndef BALLAST_KERNELS_CAUSAL_CONV1D_H_
#define BALLAST_KERNELS_CAUSAL_CONV1D_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& cu_seqlens, const at::Tensor& initial_window);

// The same in ATen ops: K shifted gathers of x (a shift that crosses a
// document's start reads its window, or a zero row), weighted and summed, then
// SiLU; autograd derives the backward. Public for the tests.
at::Tensor causal_conv1d_silu_aten(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& cu_seqlens, const at::Tensor& initial_window);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CAUSAL_CONV1D_H_
