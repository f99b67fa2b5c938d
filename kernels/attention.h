// attention: packed variable-length multi-head attention with structural masks.
//
// Layout: the documents of a batch are packed along one token axis.
//   q    (T, Hq, D)    fp32 / bf16 / fp16, contiguous
//   k, v (T, Hkv, D)   same dtype; Hq % Hkv == 0 (GQA: query head h reads kv head h / (Hq/Hkv))
//   out  (T, Hq, D)    dtype of q
// Document d spans tokens [cu_seqlens[d], cu_seqlens[d+1]); no token attends
// across a document boundary. The mask is described by its structure only:
// no dense mask exists anywhere, index arithmetic is 64-bit, softmax is
// computed online in fp32, and the forward keeps the log-sum-exp for the
// backward. A query row that sees no key gets output 0 and gradient 0.
//
// Differentiable with respect to q, k and v (autograd wrapper in the .cc).
//
// Implementations, picked per call (kernels/attention_tiles.h): on CPU the
// CPU kernel; on CUDA the project's kernel (sm_80+, bf16 / fp16, head dim 64,
// 128 or 256) with tiles that fit the device's shared memory, else ATen's
// scaled_dot_product_attention per document with is_causal (fp32 inputs on
// CUDA take this path), logged once to stderr with the reason. A mask the
// fallback cannot express without a dense mask (block diffusion, a sliding
// window) is then a c10::Error naming the reason.
// The mask is compiled once per batch: calls with the same cu_seqlens tensor
// (every layer, the backward, a checkpointed recompute) share one plan
// (kernels/attention_plan.h), copied to the device once, asynchronously.
// Environment, for checks: BALLAST_ATTENTION_FALLBACK=1 sends every call to
// the fallback (CPU included); BALLAST_ATTENTION_SMEM_LIMIT=<bytes> lowers
// the shared memory the tile choice assumes (99 KiB tiles on a large GPU).
#ifndef BALLAST_KERNELS_ATTENTION_H_
#define BALLAST_KERNELS_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::kernels {

enum class MaskKind {
  // Query i sees keys j <= i of its own document.
  kCausal,
  // Block diffusion (BD3-LM / SDAR). Each document holds a noisy half x_t
  // then a clean half x_0, each of length L (so the document is 2L tokens);
  // positions are cut into blocks of block_size within each half. Inside a
  // half, a block sees its own block in both directions; a noisy block also
  // sees the clean blocks strictly before it; a clean block sees the clean
  // blocks up to and including its own.
  kBlockDiffusion,
};

struct AttentionMask {
  MaskKind kind = MaskKind::kCausal;
  // int64 (num_docs + 1), ascending, cu_seqlens[0] == 0, back() == T. On CPU.
  // Keep one tensor per batch and do not edit it in place between calls
  // that should share the compiled mask (an edit makes a new plan).
  at::Tensor cu_seqlens;
  // kCausal only: when > 0, query i also needs i - j < window (sliding window).
  int64_t window = 0;
  // kBlockDiffusion only: block length in tokens, >= 1.
  int64_t block_size = 0;
};

// softmax(q k^T * scale + structural mask) v, per head. Throws c10::Error
// naming the argument when shapes, dtypes or cu_seqlens are inconsistent.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask, double scale);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_ATTENTION_H_
