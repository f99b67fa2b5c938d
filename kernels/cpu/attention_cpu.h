// CPU implementation of kernels/attention.h; callers go through attention(),
// which validates arguments and wraps these in autograd. Nothing here checks
// shapes or dtypes again.
//
// The structural mask reaches the kernel compiled to key intervals: query row i
// sees keys [lo0, hi0) U [lo1, hi1). Causal masks, sliding windows and block
// diffusion all fit in two intervals per row, so no dense mask is ever built.
// No structural mask leaves a row without keys (every row sees itself), but the
// kernel takes any intervals, so the fully-masked-row path is reachable, and
// tested, through attention_cpu_forward / attention_cpu_backward on an
// IntervalMask built by hand.
#ifndef BALLAST_KERNELS_CPU_ATTENTION_CPU_H_
#define BALLAST_KERNELS_CPU_ATTENTION_CPU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "kernels/attention.h"

namespace ballast::kernels {

// Query tile and key tile of the FlashAttention-2 style loops. A query tile
// of m rows streams every key and value row it sees once, so taller tiles
// read K and V less often: on long documents, where K and V no longer fit in
// cache, 256-row tiles were 8-13% faster than 128-row ones (fwd and bwd, 4k to
// 32k tokens, D = 64 and 128). But a causal tile also computes its whole
// diagonal block, half of it masked, about m / L extra work on a document of
// L tokens; on the trainer's 512-token documents (D = 32) 128-row tiles were
// 12% faster. So documents (segments) shorter than kAttnLongSegment use
// kAttnShortBlockM rows.
inline constexpr int64_t kAttnBlockM = 256;
inline constexpr int64_t kAttnShortBlockM = 128;
inline constexpr int64_t kAttnLongSegment = 2048;
inline constexpr int64_t kAttnBlockN = 256;

// A mask as intervals of absolute token indices. An interval [lo, hi) with
// lo >= hi is empty; when both intervals of a row are non-empty, hi0 <= lo1.
struct IntervalMask {
  // int64 (num_segments + 1), ascending from 0 to T. Tiles never cross a
  // segment boundary: the documents, or the halves of block-diffusion documents.
  at::Tensor segments;
  // int64 (T, 4): row i = {lo0, hi0, lo1, hi1}, the keys query i sees. This
  // alone decides every masked element.
  at::Tensor key_ranges;
  // int64 (T, 4): row j = the queries that see key j, in the same form. Only
  // used by the CUDA backward, to find the query tiles of a key tile.
  at::Tensor query_ranges;
};

// Compiles a validated structural mask over T tokens.
IntervalMask interval_mask(const AttentionMask& mask, int64_t num_tokens);

struct AttentionCpuForward {
  at::Tensor out;  // (T, Hq, D) in q's dtype.
  // (Hq, T) log-sum-exp of the scaled scores of each row, -inf for a row that
  // sees no key. fp32 (fp64 for fp64 inputs).
  at::Tensor lse;
};

// q (T, Hq, D), k and v (T, Hkv, D), contiguous, one dtype among fp64, fp32,
// bf16, fp16. Accumulates in fp32 (fp64 for fp64 inputs).
AttentionCpuForward attention_cpu_forward(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const IntervalMask& mask,
                                          double scale);

struct AttentionCpuGrads {
  at::Tensor q;  // (T, Hq, D) in q's dtype.
  at::Tensor k;  // (T, Hkv, D) in k's dtype, summed over the query heads of each kv head.
  at::Tensor v;  // (T, Hkv, D) in v's dtype, likewise.
};

// grad_out (T, Hq, D); out and lse are the forward's. Rows with lse == -inf get
// gradient 0 and contribute nothing.
AttentionCpuGrads attention_cpu_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                         const at::Tensor& k, const at::Tensor& v,
                                         const at::Tensor& out, const at::Tensor& lse,
                                         const IntervalMask& mask, double scale);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_ATTENTION_CPU_H_
