// Which attention implementation runs on a CUDA device, with which tiles, and
// how much shared memory each pass needs. Pure host code: it runs and is
// tested without a GPU (tests/unit/kernels/attention_tiles_test.cc), and the
// CUDA kernels take their shared-memory layout from the same constexpr
// function, so the bytes chosen here are the bytes a launch asks for.
//
// The project's kernel (kernels/cuda/attention_*.cu) runs three passes: the
// forward, the dQ pass and the dK/dV pass. Each has two compiled tile
// variants per head dim: a large one for cards that let a block opt in to
// 163 KiB or more of shared memory (sm_80, sm_90, sm_100) and a small one
// that fits the 99 KiB of sm_86, sm_89 and sm_120 (A10, L4, L40S, RTX). Each
// pass takes the largest variant that fits the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin). Where no variant can run, the
// fallback is ATen's scaled_dot_product_attention per document
// (kernels/attention_fallback.h), which expresses causal masks only.
#ifndef BALLAST_KERNELS_ATTENTION_TILES_H_
#define BALLAST_KERNELS_ATTENTION_TILES_H_

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

#include "kernels/attention.h"

namespace ballast::kernels {

// Rows of a tile: `rows` of the block's own side (queries for the forward
// and dQ, keys for dK/dV) by `cols` rows of the side it streams through.
struct TileShape {
  int rows = 0;
  int cols = 0;
};
// Spelled out: the CUDA sources are C++17, without defaulted comparisons.
constexpr bool operator==(const TileShape& a, const TileShape& b) {
  return a.rows == b.rows && a.cols == b.cols;
}

enum class AttentionPass { kForward, kQueryGrad, kKeyValueGrad };

// Byte offsets of every shared-memory buffer of one pass, for query tiles of
// rows_q rows and key tiles of rows_k rows; a buffer a pass does not use has
// the size 0 (its offset equals the next one's). Every buffer starts 128-byte
// aligned (more than the 32 bytes wmma and the 16 bytes cp.async need). Rows
// are padded so that consecutive rows shift by 16 bytes and the 8 rows a wmma
// load touches fall in different banks.
struct SmemLayout {
  int ld_t;    // elements per row of the bf16 / fp16 tiles: head_dim + 8
  int ld_s;    // elements per row of the fp32 score tiles: rows_k + 4
  int ld_o;    // elements per row of the fp32 accumulators: head_dim + 4
  int q;       // (rows_q, ld_t)  Q
  int dout;    // (rows_q, ld_t)  dO                         backward only
  int k;       // (rows_k, ld_t)  K
  int v;       // (rows_k, ld_t)  V
  int s;       // (rows_q, ld_s)  S, then P (or dS) in the input dtype over each row
  int dp;      // (rows_q, ld_s)  dP, then dS over each row  backward only
  int acc_q;   // (rows_q, ld_o)  O (forward) or dQ          not dK/dV
  int acc_k;   // (rows_k, ld_o)  dK                         dK/dV only
  int acc_v;   // (rows_k, ld_o)  dV                         dK/dV only
  int ranges;  // (rows_q, 4) int64 key intervals of the query rows
  int stat0;   // (rows_q) fp32: running max (forward) or log2-domain lse (backward)
  int stat1;   // (rows_q) fp32: running sum (forward) or Delta (backward)
  int bytes;   // total
};

constexpr int SmemAlignUp(int bytes) { return (bytes + 127) / 128 * 128; }

constexpr SmemLayout MakeSmemLayout(AttentionPass pass, int head_dim, int rows_q, int rows_k) {
  constexpr int kElem = 2;  // bf16 / fp16 operands
  const bool backward = pass != AttentionPass::kForward;
  const bool kv = pass == AttentionPass::kKeyValueGrad;
  SmemLayout l{};
  l.ld_t = head_dim + 8;
  l.ld_s = rows_k + 4;
  l.ld_o = head_dim + 4;
  l.q = 0;
  l.dout = SmemAlignUp(l.q + rows_q * l.ld_t * kElem);
  l.k = SmemAlignUp(l.dout + (backward ? rows_q * l.ld_t * kElem : 0));
  l.v = SmemAlignUp(l.k + rows_k * l.ld_t * kElem);
  l.s = SmemAlignUp(l.v + rows_k * l.ld_t * kElem);
  l.dp = SmemAlignUp(l.s + rows_q * l.ld_s * 4);
  l.acc_q = SmemAlignUp(l.dp + (backward ? rows_q * l.ld_s * 4 : 0));
  l.acc_k = SmemAlignUp(l.acc_q + (kv ? 0 : rows_q * l.ld_o * 4));
  l.acc_v = SmemAlignUp(l.acc_k + (kv ? rows_k * l.ld_o * 4 : 0));
  l.ranges = SmemAlignUp(l.acc_v + (kv ? rows_k * l.ld_o * 4 : 0));
  l.stat0 = SmemAlignUp(l.ranges + rows_q * 4 * 8);
  l.stat1 = SmemAlignUp(l.stat0 + rows_q * 4);
  l.bytes = SmemAlignUp(l.stat1 + rows_q * 4);
  return l;
}

// The rows (queries, keys) of a pass's tile shape, for MakeSmemLayout.
constexpr int QueryRows(AttentionPass pass, TileShape t) {
  return pass == AttentionPass::kKeyValueGrad ? t.cols : t.rows;
}
constexpr int KeyRows(AttentionPass pass, TileShape t) {
  return pass == AttentionPass::kKeyValueGrad ? t.rows : t.cols;
}
constexpr int SmemBytes(AttentionPass pass, int head_dim, TileShape t) {
  return MakeSmemLayout(pass, head_dim, QueryRows(pass, t), KeyRows(pass, t)).bytes;
}

// The compiled variants of one pass: [0] large, [1] small (fits 99 KiB).
struct PassVariants {
  TileShape large;
  TileShape small;
};
struct TileVariants {
  PassVariants fwd;
  PassVariants dq;
  PassVariants dkv;
};

// Per head dim. Larger tiles reload K and V (forward, dQ) or Q and dO (dK/dV)
// less often; the fp32 accumulators (rows x head_dim) are what makes head dim
// 256 tiles small. dK/dV at D = 256 needs 16-key tiles to fit 99 KiB, since
// its two (keys, 256) fp32 accumulators alone are 66 KiB at 32 keys.
constexpr TileVariants TileVariantsFor(int head_dim) {
  switch (head_dim) {
    case 64:
      return {{{64, 64}, {64, 64}}, {{64, 64}, {64, 64}}, {{64, 64}, {64, 32}}};
    case 128:
      return {{{64, 64}, {64, 32}}, {{64, 64}, {32, 64}}, {{64, 32}, {32, 32}}};
    default:  // 256
      return {{{64, 32}, {32, 32}}, {{32, 32}, {16, 32}}, {{32, 32}, {16, 32}}};
  }
}

// Shared memory every supported card lets a block opt in to, at least: the
// small variants must fit it.
inline constexpr int kSmallCardSmemBytes = 99 * 1024;

// What the device offers. smem_optin_bytes: sharedMemPerBlockOptin.
struct DeviceCaps {
  int sm_major = 0;
  int sm_minor = 0;
  int64_t smem_optin_bytes = 0;
};

enum class AttentionImpl {
  kKernel,        // the project's kernel, with the tiles below
  kSdpaFallback,  // ATen's scaled_dot_product_attention per document, is_causal
  kUnsupported,   // neither: the mask needs the kernel (reason says why)
};

struct AttentionChoice {
  AttentionImpl impl = AttentionImpl::kKernel;
  // Why the kernel does not run; empty when it does.
  std::string reason;
  // kKernel only: each pass's tile shape and dynamic shared memory bytes.
  TileShape fwd, dq, dkv;
  int fwd_bytes = 0, dq_bytes = 0, dkv_bytes = 0;
};

// The implementation for inputs of head_dim and dtype under `mask` on a
// device with `caps`. The kernel needs sm_80 or newer, bf16 or fp16, head dim
// 64, 128 or 256, and a variant of every pass within caps.smem_optin_bytes.
// Otherwise the fallback, when it can express the mask (causal, no window);
// otherwise kUnsupported. Never throws.
AttentionChoice choose_attention_kernel(const DeviceCaps& caps, int64_t head_dim,
                                        at::ScalarType dtype, MaskKind kind, int64_t window);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_ATTENTION_TILES_H_
