// Gated DeltaNet on CUDA as block programs (kernels/cuda/block_program.h):
// the chunked WY form of kernels/cpu/gated_delta_rule_cpu.cc (the formulas
// and their names are that file's header), forward and backward, with the
// work split the way a GPU wants it. kernels/cuda/gated_delta_rule.cu runs
// these passes with the CUDA launcher; the unit tests run them with
// HostLaunch on the CPU against the CPU kernel.
//
// Per chunk of C = 64 tokens (a document's last one may be shorter; nothing
// is padded) and value head h (key head h / (Hv / Hk)), with S0 the state
// the chunk starts from:
//   A = strict_lower(beta_i E_ij k_i . k_j),  W = (I + A)^-1 R,
//   U = W_v - W_k S0,  O = Q~ S0 + P U,  S_L = exp(G_L) S0 + K~^T U.
//
// Forward, three launches:
//   Factor       (chunk, head)              k normalised, A, the WY factors
//                                           W_v, W_k by forward substitution
//                                           (one column per thread), K~.
//   Recurrence   (document, head, Dv tile)  chunks in order: keeps S0 per
//                                           chunk, U = W_v - W_k S0 (over W_v),
//                                           S_L; the state tile (Dk, 32) stays
//                                           in shared memory.
//   Output       (chunk, head)              P, Q~, O = Q~ S0 + P U.
// Backward, five launches (dS_L: the gradient of the state a chunk ends with):
//   Factor again, and U = W_v - W_k S0 from the kept S0 (no U is stored).
//   Dup          (chunk, head)              dU_p = P^T dO, X = Q~^T dO - W_k^T dU_p.
//   BackRecurrence (document, head, Dv tile) chunks in reverse: Y = K~ dS_L,
//                                           dU = dU_p + Y, dS0 = exp(G_L) dS_L
//                                           + X - W_k^T Y; keeps dS_L per chunk.
//   Grads        (chunk, head)              every gradient of the chunk
//                                           (dR = (I + A)^-T dW by backward
//                                           substitution); dq and dk per value head.
//   Norms        (token, key head)          the group's dq and dk summed in head
//                                           order, then the L2 norms' backward.
// Memory, fp32: the forward holds W_v/U, W_k and K~ (T Hv (Dv + 2 Dk)) and
// keeps the per-chunk states (chunks Hv Dk Dv) for the backward; the
// backward holds W_v, U, dU, dO, W_k, K~ (then dW_k), and dq, dk per value
// head: O(T Hv (Dk + Dv)) and the per-chunk states and dS_L, never O(T^2)
// and never a per-token state.
//
// Precision: every product is fp32 on CUDA cores, as on the CPU, so that the
// two kernels agree to fp32 rounding (1e-5) for fp32 inputs; tensor cores
// would round operands to bf16 or TF32. The numerics contract is the CPU
// kernel's: fp32 state and gates, outputs rounded once to the input dtype.
// Each output element is summed in a fixed order by one thread, so the
// result does not depend on the schedule (the block sums of <S0, dS_L> are
// fixed by the thread count).
#ifndef BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_BLOCKS_H_
#define BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_BLOCKS_H_

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/gated_delta_rule_cpu.h"
#include "kernels/cuda/block_program.h"

namespace ballast::kernels::gdr_blocks {

using block_program::Grid;
using block_program::In;
using block_program::Out;
using block_program::Product;
using block_program::SmemPlan;

inline constexpr int64_t kC = kGdrChunk;
inline constexpr int64_t kLdC = kC + 1;  // row stride of (C, C) tiles; odd, so no bank conflicts
// Value columns per recurrence block: Dv / 32 blocks per (document, head).
inline constexpr int64_t kTile = 32;
inline constexpr int64_t kLdTile = kTile + 1;

// Rows of q, k or v as given: fp32 or bf16, unit stride in the head dim, any
// token and head strides.
struct Rows {
  const void* p;
  int64_t s0, s1;
  bool bf16;
  BALLAST_HD float operator()(int64_t t, int64_t h, int64_t d) const {
    const int64_t at = t * s0 + h * s1 + d;
    return bf16 ? static_cast<float>(static_cast<const c10::BFloat16*>(p)[at])
                : static_cast<const float*>(p)[at];
  }
};

// The inputs and sizes every pass reads. Buffers shaped (T, Hv, D) have row
// (t, h) at (t Hv + h) D.
struct Problem {
  Rows q, k, v;
  const float* g;            // (T, Hv) fp32
  const float* beta;         // (T, Hv) fp32
  const int64_t* chunks;     // (chunks, 2): first token, length
  const int64_t* doc_first;  // (N + 1): document n's chunks are [doc_first[n], doc_first[n + 1])
  int64_t tokens, hk, hv, dk, dv, group, docs, num_chunks;
  float scale, eps;

  BALLAST_HD int64_t ldk() const { return dk + 1; }  // row stride of (C, Dk) tiles
  BALLAST_HD int64_t state(int64_t c, int64_t h) const { return (c * hv + h) * dk * dv; }
  BALLAST_HD int64_t tiles() const { return (dv + kTile - 1) / kTile; }
};

// The chunk's scalars, in shared memory: G (cumulative g), exp(G),
// exp(G_L - G) and beta.
struct Decays {
  float *cum, *eg, *tail, *beta;
};

// Shared-memory offsets of the vectors of Decays.
struct DecayOffsets {
  int64_t cum, eg, tail, beta;
  BALLAST_HD static DecayOffsets Take(SmemPlan& plan) {
    return {plan.Take(kC), plan.Take(kC), plan.Take(kC), plan.Take(kC)};
  }
  BALLAST_HD Decays At(float* smem) const {
    return {smem + cum, smem + eg, smem + tail, smem + beta};
  }
};

// dst (C, ldk) <- rows [begin, begin + n) of x, key head kh, L2-normalised
// and times mult (x r mult, r = (x . x + eps)^-1/2, as the CPU kernel); r (C)
// is scratch. Ends with a barrier.
template <class Block>
BALLAST_HD_INLINE void LoadNormalized(const Block& b, const Problem& p, const Rows& x,
                                      int64_t begin, int64_t n, int64_t kh, float mult, float* dst,
                                      float* r) {
  const int64_t dk = p.dk, ld = p.ldk();
  for (int64_t idx = b.tid(); idx < n * dk; idx += b.threads())
    dst[(idx / dk) * ld + idx % dk] = x(begin + idx / dk, kh, idx % dk);
  b.sync();
  for (int64_t i = b.tid(); i < n; i += b.threads()) {
    float ss = 0.0f;
    for (int64_t d = 0; d < dk; ++d) ss += dst[i * ld + d] * dst[i * ld + d];
    r[i] = 1.0f / sqrtf(ss + p.eps);
  }
  b.sync();
  for (int64_t idx = b.tid(); idx < n * dk; idx += b.threads()) {
    const int64_t i = idx / dk;
    dst[i * ld + idx % dk] *= r[i] * mult;
  }
  b.sync();
}

// G_L, the chunk's whole log decay, summed in the order LoadDecays sums it.
BALLAST_HD_INLINE float ChunkLogDecay(const Problem& p, int64_t begin, int64_t n, int64_t h) {
  float running = 0.0f;
  for (int64_t i = 0; i < n; ++i) running += p.g[(begin + i) * p.hv + h];
  return running;
}

// The chunk's Decays. Ends with a barrier.
template <class Block>
BALLAST_HD_INLINE void LoadDecays(const Block& b, const Problem& p, int64_t begin, int64_t n,
                                  int64_t h, const Decays& s) {
  if (b.tid() == 0) {
    float running = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      running += p.g[(begin + i) * p.hv + h];
      s.cum[i] = running;
      s.eg[i] = expf(running);
      s.beta[i] = p.beta[(begin + i) * p.hv + h];
    }
  }
  b.sync();
  for (int64_t i = b.tid(); i < n; i += b.threads()) s.tail[i] = expf(s.cum[n - 1] - s.cum[i]);
  b.sync();
}

// A (C, kLdC) <- strict_lower(beta_i E_ij gram_ij) from gram, in place or not.
template <class Block>
BALLAST_HD_INLINE void DecayGram(const Block& b, int64_t n, const Decays& s, const float* gram,
                                 float* a) {
  for (int64_t idx = b.tid(); idx < n * n; idx += b.threads()) {
    const int64_t i = idx / n, j = idx % n;
    a[i * kLdC + j] = j < i ? s.beta[i] * expf(s.cum[i] - s.cum[j]) * gram[i * kLdC + j] : 0.0f;
  }
}

// dst (rows, width) <- src (rows, width), each with its row stride: the
// moves of a recurrence block's tiles between shared and global memory.
template <class Block>
BALLAST_HD_INLINE void CopyRows(const Block& b, int64_t rows, int64_t width, const float* src,
                                int64_t ld_src, float* dst, int64_t ld_dst) {
  for (int64_t idx = b.tid(); idx < rows * width; idx += b.threads())
    dst[(idx / width) * ld_dst + idx % width] = src[(idx / width) * ld_src + idx % width];
}

// The Dv columns [j0, j0 + width) of recurrence block `tile`.
struct ValueTile {
  int64_t j0, width;
  BALLAST_HD ValueTile(int64_t tile, int64_t dv)
      : j0(tile * kTile), width(dv - tile * kTile < kTile ? dv - tile * kTile : kTile) {}
};

// Factor, per (chunk, head): W_v, W_k and K~ into (T, Hv, D) buffers; with
// u set, also U = W_v - W_k S0 from the kept states (the backward's).
struct FactorBody {
  Problem p;
  float* wv;                      // (T, Hv, Dv)
  float* wk;                      // (T, Hv, Dk)
  float* kt;                      // (T, Hv, Dk)
  const float* states = nullptr;  // (chunks, Hv, Dk, Dv), with u
  float* u = nullptr;             // (T, Hv, Dv) or null

  struct Layout {
    int64_t kn, a, r;
    DecayOffsets decays;
    int64_t total;
  };
  BALLAST_HD static Layout Plan(int64_t dk) {
    SmemPlan plan;
    Layout l{};
    l.kn = plan.Take(kC * (dk + 1));
    l.a = plan.Take(kC * kLdC);
    l.r = plan.Take(kC);
    l.decays = DecayOffsets::Take(plan);
    l.total = plan.used;
    return l;
  }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t c, int64_t h, int64_t) const {
    const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1];
    const int64_t dk = p.dk, dv = p.dv, hv = p.hv, ld = p.ldk(), row = begin * hv + h;
    const Layout l = Plan(dk);
    float* kn = b.smem + l.kn;
    float* a = b.smem + l.a;
    const Decays s = l.decays.At(b.smem);
    LoadNormalized(b, p, p.k, begin, n, h / p.group, 1.0f, kn, b.smem + l.r);
    LoadDecays(b, p, begin, n, h, s);
    Product(b, n, n, dk, 1.0f, In{kn, ld, 1}, In{kn, 1, ld}, Out{a, kLdC, 1}, false);
    b.sync();
    DecayGram(b, n, s, a, a);
    // R_v = beta v and R_k = beta exp(G) k, solved in place below; K~.
    const Out wvo{wv + row * dv, hv * dv, 1}, wko{wk + row * dk, hv * dk, 1};
    const Out kto{kt + row * dk, hv * dk, 1};
    for (int64_t idx = b.tid(); idx < n * dv; idx += b.threads()) {
      const int64_t i = idx / dv, e = idx % dv;
      wvo(i, e) = p.v(begin + i, h, e) * s.beta[i];
    }
    for (int64_t idx = b.tid(); idx < n * dk; idx += b.threads()) {
      const int64_t i = idx / dk, d = idx % dk;
      wko(i, d) = kn[i * ld + d] * (s.beta[i] * s.eg[i]);
      kto(i, d) = kn[i * ld + d] * s.tail[i];
    }
    b.sync();
    block_program::SolveUnitLower(b, In{a, kLdC, 1}, n, wvo, dv, wko, dk);
    if (u == nullptr) return;
    b.sync();
    const Out uo{u + row * dv, hv * dv, 1};
    for (int64_t idx = b.tid(); idx < n * dv; idx += b.threads())
      uo(idx / dv, idx % dv) = wvo(idx / dv, idx % dv);
    b.sync();
    Product(b, n, dv, dk, -1.0f, wko, In{states + p.state(c, h), dv, 1}, uo, true);
  }
};

// Recurrence, per (document, head, Dv tile), chunks in order: stores S0 of
// each chunk, turns W_v into U, and leaves the final state.
struct RecurrenceBody {
  Problem p;
  const float* wk;     // (T, Hv, Dk)
  const float* kt;     // (T, Hv, Dk)
  float* wv;           // (T, Hv, Dv): W_v in, U out
  float* states;       // (chunks, Hv, Dk, Dv) out
  float* final_state;  // (N, Hv, Dk, Dv): the initial state in, the final out

  struct Layout {
    int64_t s, u, total;
  };
  BALLAST_HD static Layout Plan(int64_t dk) {
    SmemPlan plan;
    Layout l{};
    l.s = plan.Take(dk * kLdTile);
    l.u = plan.Take(kC * kLdTile);
    l.total = plan.used;
    return l;
  }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t doc, int64_t h, int64_t tile) const {
    const int64_t dk = p.dk, dv = p.dv, hv = p.hv;
    const ValueTile vt(tile, dv);
    const int64_t bv = vt.width;
    const Layout l = Plan(dk);
    float* s = b.smem + l.s;
    float* u = b.smem + l.u;
    float* fin = final_state + p.state(doc, h) + vt.j0;
    CopyRows(b, dk, bv, fin, dv, s, kLdTile);
    b.sync();
    for (int64_t c = p.doc_first[doc]; c < p.doc_first[doc + 1]; ++c) {
      const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1], row = begin * hv + h;
      float* u_rows = wv + row * dv + vt.j0;
      CopyRows(b, dk, bv, s, kLdTile, states + p.state(c, h) + vt.j0, dv);
      CopyRows(b, n, bv, u_rows, hv * dv, u, kLdTile);
      b.sync();
      // U = W_v - W_k S0.
      Product(b, n, bv, dk, -1.0f, In{wk + row * dk, hv * dk, 1}, In{s, kLdTile, 1},
              Out{u, kLdTile, 1}, true);
      b.sync();
      const float decay = expf(ChunkLogDecay(p, begin, n, h));
      CopyRows(b, n, bv, u, kLdTile, u_rows, hv * dv);
      for (int64_t idx = b.tid(); idx < dk * bv; idx += b.threads())
        s[(idx / bv) * kLdTile + idx % bv] *= decay;
      b.sync();
      // S_L = exp(G_L) S0 + K~^T U.
      Product(b, dk, bv, n, 1.0f, In{kt + row * dk, 1, hv * dk}, In{u, kLdTile, 1},
              Out{s, kLdTile, 1}, true);
      b.sync();
    }
    CopyRows(b, dk, bv, s, kLdTile, fin, dv);
  }
};

// The shared-memory tiles of a pass that forms P: q and k normalised, P.
struct AttentionOffsets {
  int64_t qn, kn, pm, r;
  DecayOffsets decays;
  BALLAST_HD static AttentionOffsets Take(SmemPlan& plan, int64_t dk) {
    AttentionOffsets o{};
    o.qn = plan.Take(kC * (dk + 1));
    o.kn = plan.Take(kC * (dk + 1));
    o.pm = plan.Take(kC * kLdC);
    o.r = plan.Take(kC);
    o.decays = DecayOffsets::Take(plan);
    return o;
  }
};

// q (times scale) and k normalised, the decays, P = E * (Q K^T) on j <= i,
// then q turned into Q~ = exp(G) q. Ends with a barrier.
template <class Block>
BALLAST_HD_INLINE void LoadDecayedAttention(const Block& b, const Problem& p, int64_t begin,
                                            int64_t n, int64_t h, const AttentionOffsets& o) {
  const int64_t dk = p.dk, ld = p.ldk();
  float* qn = b.smem + o.qn;
  float* kn = b.smem + o.kn;
  float* pm = b.smem + o.pm;
  const Decays s = o.decays.At(b.smem);
  LoadNormalized(b, p, p.q, begin, n, h / p.group, p.scale, qn, b.smem + o.r);
  LoadNormalized(b, p, p.k, begin, n, h / p.group, 1.0f, kn, b.smem + o.r);
  LoadDecays(b, p, begin, n, h, s);
  Product(b, n, n, dk, 1.0f, In{qn, ld, 1}, In{kn, 1, ld}, Out{pm, kLdC, 1}, false);
  b.sync();
  for (int64_t idx = b.tid(); idx < n * n; idx += b.threads()) {
    const int64_t i = idx / n, j = idx % n;
    pm[i * kLdC + j] = j <= i ? pm[i * kLdC + j] * expf(s.cum[i] - s.cum[j]) : 0.0f;
  }
  for (int64_t idx = b.tid(); idx < n * dk; idx += b.threads())
    qn[(idx / dk) * ld + idx % dk] *= s.eg[idx / dk];
  b.sync();
}

// Output, per (chunk, head): O = Q~ S0 + P U into a fp32 (T, Hv, Dv) buffer.
struct OutputBody {
  Problem p;
  const float* u;       // (T, Hv, Dv)
  const float* states;  // (chunks, Hv, Dk, Dv)
  float* out;           // (T, Hv, Dv)

  struct Layout {
    AttentionOffsets att;
    int64_t total;
  };
  BALLAST_HD static Layout Plan(int64_t dk) {
    SmemPlan plan;
    Layout l{};
    l.att = AttentionOffsets::Take(plan, dk);
    l.total = plan.used;
    return l;
  }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t c, int64_t h, int64_t) const {
    const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1];
    const int64_t dk = p.dk, dv = p.dv, hv = p.hv, row = begin * hv + h;
    const Layout l = Plan(dk);
    LoadDecayedAttention(b, p, begin, n, h, l.att);
    const Out o{out + row * dv, hv * dv, 1};
    Product(b, n, dv, dk, 1.0f, In{b.smem + l.att.qn, p.ldk(), 1},
            In{states + p.state(c, h), dv, 1}, o, false);
    Product(b, n, dv, n, 1.0f, In{b.smem + l.att.pm, kLdC, 1}, In{u + row * dv, hv * dv, 1}, o,
            true);
  }
};

// Dup, per (chunk, head): dU_p = P^T dO, and X = Q~^T dO - W_k^T dU_p into
// the chunk's slot.
struct DupBody {
  Problem p;
  const float* d_out;  // (T, Hv, Dv) fp32
  const float* wk;     // (T, Hv, Dk)
  float* du;           // (T, Hv, Dv) out
  float* slots;        // (chunks, Hv, Dk, Dv) out

  using Layout = OutputBody::Layout;
  BALLAST_HD static Layout Plan(int64_t dk) { return OutputBody::Plan(dk); }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t c, int64_t h, int64_t) const {
    const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1];
    const int64_t dk = p.dk, dv = p.dv, hv = p.hv, row = begin * hv + h;
    const Layout l = Plan(dk);
    LoadDecayedAttention(b, p, begin, n, h, l.att);
    const In d_o{d_out + row * dv, hv * dv, 1};
    const Out dup{du + row * dv, hv * dv, 1}, x{slots + p.state(c, h), dv, 1};
    Product(b, n, dv, n, 1.0f, In{b.smem + l.att.pm, 1, kLdC}, d_o, dup, false);
    Product(b, dk, dv, n, 1.0f, In{b.smem + l.att.qn, 1, p.ldk()}, d_o, x, false);
    b.sync();
    Product(b, dk, dv, n, -1.0f, In{wk + row * dk, 1, hv * dk}, dup, x, true);
  }
};

// BackRecurrence, per (document, head, Dv tile), chunks in reverse: dU =
// dU_p + K~ dS_L, the slot's X replaced by dS_L, and dS0 chained back to the
// document's initial state.
struct BackRecurrenceBody {
  Problem p;
  const float* kt;  // (T, Hv, Dk)
  const float* wk;  // (T, Hv, Dk)
  float* du;        // (T, Hv, Dv): dU_p in, dU out
  float* slots;     // (chunks, Hv, Dk, Dv): X in, dS_L out
  float* d_state;   // (N, Hv, Dk, Dv): d final_state in, d initial_state out

  using Layout = RecurrenceBody::Layout;
  BALLAST_HD static Layout Plan(int64_t dk) { return RecurrenceBody::Plan(dk); }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t doc, int64_t h, int64_t tile) const {
    const int64_t dk = p.dk, dv = p.dv, hv = p.hv;
    const ValueTile vt(tile, dv);
    const int64_t bv = vt.width, j0 = vt.j0;
    const Layout l = Plan(dk);
    float* ds = b.smem + l.s;
    float* y = b.smem + l.u;
    float* fin = d_state + p.state(doc, h) + j0;
    CopyRows(b, dk, bv, fin, dv, ds, kLdTile);
    b.sync();
    for (int64_t c = p.doc_first[doc + 1] - 1; c >= p.doc_first[doc]; --c) {
      const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1], row = begin * hv + h;
      // Y = K~ dS_L.
      Product(b, n, bv, dk, 1.0f, In{kt + row * dk, hv * dk, 1}, In{ds, kLdTile, 1},
              Out{y, kLdTile, 1}, false);
      b.sync();
      const float decay = expf(ChunkLogDecay(p, begin, n, h));
      for (int64_t idx = b.tid(); idx < n * bv; idx += b.threads())
        du[(row + (idx / bv) * hv) * dv + j0 + idx % bv] += y[(idx / bv) * kLdTile + idx % bv];
      float* slot = slots + p.state(c, h) + j0;
      for (int64_t idx = b.tid(); idx < dk * bv; idx += b.threads()) {
        const int64_t d = idx / bv, j = idx % bv;
        const float x = slot[d * dv + j];
        slot[d * dv + j] = ds[d * kLdTile + j];
        ds[d * kLdTile + j] = decay * ds[d * kLdTile + j] + x;
      }
      b.sync();
      // dS0 -= W_k^T Y.
      Product(b, dk, bv, n, -1.0f, In{wk + row * dk, 1, hv * dk}, In{y, kLdTile, 1},
              Out{ds, kLdTile, 1}, true);
      b.sync();
    }
    CopyRows(b, dk, bv, ds, kLdTile, fin, dv);
  }
};

// Grads, per (chunk, head): dq and dk of the normalised rows for this value
// head, dv, dg, dbeta. The steps and their formulas are the CPU kernel's
// phase 3; the (C, C) terms of dG are summed per element first (F below) and
// then as row sums minus column sums, so that no two threads add to one dG_i.
struct GradsBody {
  Problem p;
  const float* u;       // (T, Hv, Dv)
  const float* wv;      // (T, Hv, Dv)
  const float* wk;      // (T, Hv, Dk)
  const float* d_out;   // (T, Hv, Dv) fp32
  const float* states;  // (chunks, Hv, Dk, Dv): S0
  const float* slots;   // (chunks, Hv, Dk, Dv): dS_L
  float* du;            // (T, Hv, Dv): dU in, dR_v, then dv out
  float* dwk;           // (T, Hv, Dk): scratch, dW_k then dR_k
  float* dq;            // (T, Hv, Dk) out, the normalised q's gradient (before the scale)
  float* dk;            // (T, Hv, Dk) out
  float* dg;            // (T, Hv) out
  float* db;            // (T, Hv) out

  struct Layout {
    int64_t qn, kn, a, gram, f, dp, da, r, dG, dbeta, t, partial, sdot;
    DecayOffsets decays;
    int64_t total;
  };
  BALLAST_HD static Layout Plan(int64_t dk) {
    SmemPlan plan;
    Layout l{};
    l.qn = plan.Take(kC * (dk + 1));
    l.kn = plan.Take(kC * (dk + 1));
    l.a = plan.Take(kC * kLdC);
    l.gram = plan.Take(kC * kLdC);
    l.f = plan.Take(kC * kLdC);
    l.dp = plan.Take(kC * kLdC);
    l.da = plan.Take(kC * kLdC);
    l.r = plan.Take(kC);
    l.dG = plan.Take(kC);
    l.dbeta = plan.Take(kC);
    l.t = plan.Take(kC);
    l.partial = plan.Take(block_program::kBlockThreads);
    l.sdot = plan.Take(1);
    l.decays = DecayOffsets::Take(plan);
    l.total = plan.used;
    return l;
  }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t c, int64_t h, int64_t) const {
    const int64_t begin = p.chunks[2 * c], n = p.chunks[2 * c + 1];
    const int64_t dkk = p.dk, dv = p.dv, hv = p.hv, ld = p.ldk(), row = begin * hv + h;
    const int64_t st = p.state(c, h);
    const Layout l = Plan(dkk);
    float* qn = b.smem + l.qn;
    float* kn = b.smem + l.kn;
    float* a = b.smem + l.a;
    float* gram = b.smem + l.gram;
    float* f = b.smem + l.f;
    float* dp = b.smem + l.dp;
    float* da = b.smem + l.da;
    float* dG = b.smem + l.dG;
    float* dbeta = b.smem + l.dbeta;
    float* t = b.smem + l.t;
    float* partial = b.smem + l.partial;
    float* sdot = b.smem + l.sdot;
    const Decays s = l.decays.At(b.smem);
    LoadNormalized(b, p, p.q, begin, n, h / p.group, p.scale, qn, b.smem + l.r);
    LoadNormalized(b, p, p.k, begin, n, h / p.group, 1.0f, kn, b.smem + l.r);
    LoadDecays(b, p, begin, n, h, s);
    const In u_rows{u + row * dv, hv * dv, 1}, wv_rows{wv + row * dv, hv * dv, 1};
    const In wk_rows{wk + row * dkk, hv * dkk, 1}, d_o{d_out + row * dv, hv * dv, 1};
    const In s0{states + st, dv, 1}, ds{slots + st, dv, 1};
    const Out dU{du + row * dv, hv * dv, 1}, dWk{dwk + row * dkk, hv * dkk, 1};
    const Out dQ{dq + row * dkk, hv * dkk, 1}, dK{dk + row * dkk, hv * dkk, 1};
    const In qs{qn, ld, 1}, ks{kn, ld, 1};

    // 1. Products of the inputs: k . k, Q K^T, dO U^T; dQ = dO S0^T and
    // dK~ = U dS_L^T (both raw: the decays come after their dG terms);
    // dW_k = -dU S0^T; the block's share of <S0, dS_L>.
    Product(b, n, n, dkk, 1.0f, ks, ks.T(), Out{gram, kLdC, 1}, false);
    Product(b, n, n, dkk, 1.0f, qs, ks.T(), Out{f, kLdC, 1}, false);
    Product(b, n, n, dv, 1.0f, d_o, u_rows.T(), Out{dp, kLdC, 1}, false);
    Product(b, n, dkk, dv, 1.0f, d_o, s0.T(), dQ, false);
    Product(b, n, dkk, dv, 1.0f, u_rows, ds.T(), dK, false);
    Product(b, n, dkk, dv, -1.0f, In(dU), s0.T(), dWk, false);
    float acc = 0.0f;
    for (int64_t idx = b.tid(); idx < dkk * dv; idx += b.threads()) acc += s0.p[idx] * ds.p[idx];
    partial[b.tid()] = acc;
    b.sync();

    // 2. A; dG_i = exp(G_i) q_i . (S0 dO_i); t_j = exp(G_L - G_j) k_j . dK~_j.
    DecayGram(b, n, s, gram, a);
    for (int64_t i = b.tid(); i < n; i += b.threads()) {
      float qd = 0.0f, kd = 0.0f;
      for (int64_t d = 0; d < dkk; ++d) {
        qd += qn[i * ld + d] * dQ(i, d);
        kd += kn[i * ld + d] * dK(i, d);
      }
      dG[i] = s.eg[i] * qd;
      t[i] = s.tail[i] * kd;
    }
    if (b.tid() == 0) {
      float total = 0.0f;
      for (int i = 0; i < b.threads(); ++i) total += partial[i];
      *sdot = total;
    }
    b.sync();

    // 3. dQ_i = exp(G_i) S0 dO_i, dK_j = exp(G_L - G_j) dK~_j; dR_v and dR_k.
    for (int64_t idx = b.tid(); idx < n * dkk; idx += b.threads()) {
      const int64_t i = idx / dkk, d = idx % dkk;
      dQ(i, d) *= s.eg[i];
      dK(i, d) *= s.tail[i];
    }
    block_program::SolveUnitLowerTransposed(b, In{a, kLdC, 1}, n, dU, dv, dWk, dkk);
    b.sync();

    // 4. dbeta from R_v and R_k, dK from R_k; dA = -(dR_v W_v^T + dR_k W_k^T).
    for (int64_t i = b.tid(); i < n; i += b.threads()) {
      float vd = 0.0f, kd = 0.0f;
      for (int64_t e = 0; e < dv; ++e) vd += p.v(begin + i, h, e) * dU(i, e);
      for (int64_t d = 0; d < dkk; ++d) kd += kn[i * ld + d] * dWk(i, d);
      const float r_k = s.eg[i] * kd;
      dbeta[i] = vd + r_k;
      dG[i] += s.beta[i] * r_k;
    }
    for (int64_t idx = b.tid(); idx < n * dkk; idx += b.threads()) {
      const int64_t i = idx / dkk, d = idx % dkk;
      dK(i, d) += dWk(i, d) * (s.beta[i] * s.eg[i]);
    }
    Product(b, n, n, dv, -1.0f, In(dU), wv_rows.T(), Out{da, kLdC, 1}, false);
    Product(b, n, n, dkk, -1.0f, In(dWk), wk_rows.T(), Out{da, kLdC, 1}, true);
    b.sync();

    // 5. Element by element: dP <- E dP; dA <- D = beta_i E dA (strict lower);
    // F = (E dP) * (Q K^T) + D * gram (strict lower), gram <- E dA * gram
    // (dbeta's term); dv = beta dR_v.
    for (int64_t idx = b.tid(); idx < n * n; idx += b.threads()) {
      const int64_t i = idx / n, j = idx % n, at = i * kLdC + j;
      const float e = j <= i ? expf(s.cum[i] - s.cum[j]) : 0.0f;
      const float dpe = dp[at] * e;
      const float x = j < i ? da[at] * e : 0.0f;
      const float g = gram[at];
      dp[at] = dpe;
      da[at] = x * s.beta[i];
      gram[at] = x * g;
      f[at] = j < i ? dpe * f[at] + x * s.beta[i] * g : 0.0f;
    }
    for (int64_t idx = b.tid(); idx < n * dv; idx += b.threads()) {
      const int64_t i = idx / dv, e = idx % dv;
      dU(i, e) *= s.beta[i];
    }
    b.sync();

    // 6. dG_i += sum_j F_ij - sum_j F_ji; dbeta_i += sum_j (E dA * gram)_ij;
    // dQ += dP K; dK += dP^T Q + D K + D^T K.
    for (int64_t i = b.tid(); i < n; i += b.threads()) {
      float fs = 0.0f, gs = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        fs += f[i * kLdC + j] - f[j * kLdC + i];
        gs += gram[i * kLdC + j];
      }
      dG[i] += fs;
      dbeta[i] += gs;
    }
    Product(b, n, dkk, n, 1.0f, In{dp, kLdC, 1}, ks, dQ, true);
    Product(b, n, dkk, n, 1.0f, In{dp, 1, kLdC}, qs, dK, true);
    Product(b, n, dkk, n, 1.0f, In{da, kLdC, 1}, ks, dK, true);
    Product(b, n, dkk, n, 1.0f, In{da, 1, kLdC}, ks, dK, true);
    b.sync();

    // 7. The state terms of dG_L, then dg_j = sum_{i >= j} dG_i.
    if (b.tid() == 0) {
      float tsum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        tsum += t[j];
        dG[j] -= t[j];
      }
      dG[n - 1] += tsum + s.eg[n - 1] * *sdot;
      float suffix = 0.0f;
      for (int64_t i = n - 1; i >= 0; --i) {
        suffix += dG[i];
        dg[(begin + i) * hv + h] = suffix;
        db[(begin + i) * hv + h] = dbeta[i];
      }
    }
  }
};

// Norms, per (token, key head): the group's dq and dk summed in head order
// (dq times scale), then dx = r (dy - y (y . dy)) with y = x r.
struct NormsBody {
  Problem p;
  const float* dq;  // (T, Hv, Dk)
  const float* dk;  // (T, Hv, Dk)
  float* d_q;       // (T, Hk, Dk) out
  float* d_k;       // (T, Hk, Dk) out

  struct Layout {
    int64_t dy, x, rc, total;
  };
  BALLAST_HD static Layout Plan(int64_t dk) {
    SmemPlan plan;
    Layout l{};
    l.dy = plan.Take(dk);
    l.x = plan.Take(dk);
    l.rc = plan.Take(2);
    l.total = plan.used;
    return l;
  }

  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t tok, int64_t kh, int64_t) const {
    const int64_t dkk = p.dk;
    const Layout l = Plan(dkk);
    float* dy = b.smem + l.dy;
    float* x = b.smem + l.x;
    float* rc = b.smem + l.rc;
    for (int pass = 0; pass < 2; ++pass) {
      const float* grads = pass == 0 ? dq : dk;
      const Rows& rows = pass == 0 ? p.q : p.k;
      for (int64_t d = b.tid(); d < dkk; d += b.threads()) {
        float sum = 0.0f;
        for (int64_t h = kh * p.group; h < (kh + 1) * p.group; ++h)
          sum += grads[(tok * p.hv + h) * dkk + d];
        dy[d] = pass == 0 ? sum * p.scale : sum;
        x[d] = rows(tok, kh, d);
      }
      b.sync();
      if (b.tid() == 0) {
        float xx = 0.0f, xdy = 0.0f;
        for (int64_t d = 0; d < dkk; ++d) {
          xx += x[d] * x[d];
          xdy += x[d] * dy[d];
        }
        rc[0] = 1.0f / sqrtf(xx + p.eps);
        rc[1] = rc[0] * xdy;
      }
      b.sync();
      float* dx = (pass == 0 ? d_q : d_k) + (tok * p.hk + kh) * dkk;
      for (int64_t d = b.tid(); d < dkk; d += b.threads())
        dx[d] = rc[0] * (dy[d] - x[d] * rc[0] * rc[1]);
      b.sync();
    }
  }
};

// The most shared memory any pass asks for, in floats: the Grads pass.
inline int64_t MaxSmemFloats(int64_t dk) {
  return std::max({FactorBody::Plan(dk).total, RecurrenceBody::Plan(dk).total,
                   OutputBody::Plan(dk).total, GradsBody::Plan(dk).total,
                   NormsBody::Plan(dk).total});
}

// ---------------------------------------------------------------------------
// The passes, for any launcher: Launch(Grid, smem floats, body). Tensors live
// on the inputs' device; the chunk table is built on the host from
// cu_seqlens and copied there.
// ---------------------------------------------------------------------------

struct ProblemTensors {
  Problem p;
  at::Tensor g, beta, chunks, doc_first;  // what p points into
};

inline Rows RowsOf(const at::Tensor& x) {
  return {x.const_data_ptr(), x.stride(0), x.stride(1), x.scalar_type() == at::kBFloat16};
}

inline ProblemTensors MakeProblem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& g, const at::Tensor& beta,
                                  const at::Tensor& cu_seqlens, double scale, double eps) {
  ProblemTensors t;
  GdrChunkTable table = gdr_chunk_table(cu_seqlens);
  static_assert(sizeof(GdrChunk) == 2 * sizeof(int64_t), "chunks go to the device as pairs");
  const int64_t docs = static_cast<int64_t>(table.first.size()) - 1;
  const int64_t num_chunks = static_cast<int64_t>(table.chunks.size());
  // The table on the inputs' device (a copy of the host vectors).
  auto on_device = [&](int64_t* host, int64_t count) {
    return at::from_blob(host, {count}, at::kLong).clone().to(q.device());
  };
  t.chunks = on_device(reinterpret_cast<int64_t*>(table.chunks.data()), 2 * num_chunks);
  t.doc_first = on_device(table.first.data(), docs + 1);
  t.g = g.to(at::kFloat).contiguous();
  t.beta = beta.to(at::kFloat).contiguous();
  Problem& p = t.p;
  p.q = RowsOf(q);
  p.k = RowsOf(k);
  p.v = RowsOf(v);
  p.g = t.g.const_data_ptr<float>();
  p.beta = t.beta.const_data_ptr<float>();
  p.chunks = t.chunks.const_data_ptr<int64_t>();
  p.doc_first = t.doc_first.const_data_ptr<int64_t>();
  p.tokens = q.size(0);
  p.hk = q.size(1);
  p.dk = q.size(2);
  p.hv = v.size(1);
  p.dv = v.size(2);
  p.group = p.hv / p.hk;
  p.docs = docs;
  p.num_chunks = num_chunks;
  p.scale = static_cast<float>(scale);
  p.eps = static_cast<float>(eps);
  return t;
}

// A per-document state (N, Hv, Dk, Dv) fp32 that the passes may overwrite:
// a copy of `given`, or zeros.
inline at::Tensor StateOrZeros(const at::Tensor& given, const Problem& p,
                               const at::TensorOptions& f32) {
  return given.defined() ? given.to(at::kFloat).contiguous().clone()
                         : at::zeros({p.docs, p.hv, p.dk, p.dv}, f32);
}

// gated_delta_rule_cpu_forward's contract (kernels/cpu/gated_delta_rule_cpu.h).
template <class Launch>
GdrForward ForwardPass(const Launch& launch, const at::Tensor& q, const at::Tensor& k,
                       const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                       const at::Tensor& cu_seqlens, const at::Tensor& initial_state, double scale,
                       double eps) {
  const ProblemTensors t = MakeProblem(q, k, v, g, beta, cu_seqlens, scale, eps);
  const Problem& p = t.p;
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  GdrForward result;
  result.chunk_states = at::empty({p.num_chunks, p.hv, p.dk, p.dv}, f32);
  result.final_state = StateOrZeros(initial_state, p, f32);
  at::Tensor wv = at::empty({p.tokens, p.hv, p.dv}, f32);  // W_v, then U
  at::Tensor wk = at::empty({p.tokens, p.hv, p.dk}, f32);
  at::Tensor kt = at::empty({p.tokens, p.hv, p.dk}, f32);
  float* states = result.chunk_states.mutable_data_ptr<float>();
  launch(Grid{p.num_chunks, p.hv, 1}, FactorBody::Plan(p.dk).total,
         FactorBody{p, wv.mutable_data_ptr<float>(), wk.mutable_data_ptr<float>(),
                    kt.mutable_data_ptr<float>()});
  launch(Grid{p.docs, p.hv, p.tiles()}, RecurrenceBody::Plan(p.dk).total,
         RecurrenceBody{p, wk.const_data_ptr<float>(), kt.const_data_ptr<float>(),
                        wv.mutable_data_ptr<float>(), states,
                        result.final_state.mutable_data_ptr<float>()});
  wk.reset();
  kt.reset();
  at::Tensor out = at::empty({p.tokens, p.hv, p.dv}, f32);
  launch(Grid{p.num_chunks, p.hv, 1}, OutputBody::Plan(p.dk).total,
         OutputBody{p, wv.const_data_ptr<float>(), states, out.mutable_data_ptr<float>()});
  result.out = out.to(v.scalar_type());
  return result;
}

// gated_delta_rule_cpu_backward's contract.
template <class Launch>
GdrGrads BackwardPass(const Launch& launch, const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& v, const at::Tensor& g, const at::Tensor& beta,
                      const at::Tensor& cu_seqlens, const at::Tensor& chunk_states,
                      const at::Tensor& d_out, const at::Tensor& d_final, double scale,
                      double eps) {
  const ProblemTensors t = MakeProblem(q, k, v, g, beta, cu_seqlens, scale, eps);
  const Problem& p = t.p;
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  const at::Tensor states = chunk_states.to(at::kFloat).contiguous();
  const at::Tensor d_o =
      d_out.defined() ? d_out.to(at::kFloat).contiguous() : at::zeros({p.tokens, p.hv, p.dv}, f32);
  at::Tensor wv = at::empty({p.tokens, p.hv, p.dv}, f32);
  at::Tensor u = at::empty({p.tokens, p.hv, p.dv}, f32);
  at::Tensor wk = at::empty({p.tokens, p.hv, p.dk}, f32);
  at::Tensor kt = at::empty({p.tokens, p.hv, p.dk}, f32);  // K~, then dW_k
  launch(Grid{p.num_chunks, p.hv, 1}, FactorBody::Plan(p.dk).total,
         FactorBody{p, wv.mutable_data_ptr<float>(), wk.mutable_data_ptr<float>(),
                    kt.mutable_data_ptr<float>(), states.const_data_ptr<float>(),
                    u.mutable_data_ptr<float>()});
  at::Tensor du = at::empty({p.tokens, p.hv, p.dv}, f32);               // dU_p, dU, dR_v, then dv
  at::Tensor slots = at::empty({p.num_chunks, p.hv, p.dk, p.dv}, f32);  // X, then dS_L
  launch(Grid{p.num_chunks, p.hv, 1}, DupBody::Plan(p.dk).total,
         DupBody{p, d_o.const_data_ptr<float>(), wk.const_data_ptr<float>(),
                 du.mutable_data_ptr<float>(), slots.mutable_data_ptr<float>()});
  GdrGrads grads;
  grads.d_state = StateOrZeros(d_final, p, f32);
  launch(Grid{p.docs, p.hv, p.tiles()}, BackRecurrenceBody::Plan(p.dk).total,
         BackRecurrenceBody{p, kt.const_data_ptr<float>(), wk.const_data_ptr<float>(),
                            du.mutable_data_ptr<float>(), slots.mutable_data_ptr<float>(),
                            grads.d_state.mutable_data_ptr<float>()});
  at::Tensor dq = at::empty({p.tokens, p.hv, p.dk}, f32);
  at::Tensor dk = at::empty({p.tokens, p.hv, p.dk}, f32);
  at::Tensor dg = at::empty({p.tokens, p.hv}, f32);
  at::Tensor db = at::empty({p.tokens, p.hv}, f32);
  launch(Grid{p.num_chunks, p.hv, 1}, GradsBody::Plan(p.dk).total,
         GradsBody{p, u.const_data_ptr<float>(), wv.const_data_ptr<float>(),
                   wk.const_data_ptr<float>(), d_o.const_data_ptr<float>(),
                   states.const_data_ptr<float>(), slots.const_data_ptr<float>(),
                   du.mutable_data_ptr<float>(), kt.mutable_data_ptr<float>(),
                   dq.mutable_data_ptr<float>(), dk.mutable_data_ptr<float>(),
                   dg.mutable_data_ptr<float>(), db.mutable_data_ptr<float>()});
  wv.reset();
  u.reset();
  wk.reset();
  kt.reset();
  at::Tensor d_q = at::empty({p.tokens, p.hk, p.dk}, f32);
  at::Tensor d_k = at::empty({p.tokens, p.hk, p.dk}, f32);
  launch(Grid{p.tokens, p.hk, 1}, NormsBody::Plan(p.dk).total,
         NormsBody{p, dq.const_data_ptr<float>(), dk.const_data_ptr<float>(),
                   d_q.mutable_data_ptr<float>(), d_k.mutable_data_ptr<float>()});
  grads.d_q = d_q.to(q.scalar_type());
  grads.d_k = d_k.to(k.scalar_type());
  grads.d_v = du.to(v.scalar_type());
  grads.d_g = dg.to(g.scalar_type());
  grads.d_beta = db.to(beta.scalar_type());
  return grads;
}

}  // namespace ballast::kernels::gdr_blocks

#endif  // BALLAST_KERNELS_CUDA_GATED_DELTA_RULE_BLOCKS_H_
