// Gated DeltaNet on CPU: the chunked WY form, forward and backward, in fp32.
//
// Per document and value head h (key head h / (Hv / Hk)), with q and k
// L2-normalised (q also scaled) and the state S (Dk, Dv) restarting at the
// document's initial state, the recurrence
//   S_t = exp(g_t) S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),
//   o_t = S_t^T q_t
// is computed in chunks of C = 64 tokens (the last chunk of a document may be
// shorter; nothing is padded). In a chunk of length L, with S0 the state it
// starts from, G_i = sum_{j <= i} g_j (G_L: the whole chunk's, at its last
// token), E_ij = exp(G_i - G_j) for j <= i (else 0), K~_j = exp(G_L - G_j) k_j,
// Q~_i = exp(G_i) q_i, and unrolling the recurrence:
//   A   = strict_lower(beta_i E_ij k_i . k_j)          (C, C)
//   T   = (I + A)^-1                                   (C, C) unit lower triangular
//   W_v = T (beta v)   W_k = T (beta exp(G) k)          (C, Dv), (C, Dk)  "WY factors"
//   U   = W_v - W_k S0                                 (C, Dv)  the u_t of the chunk
//   O   = Q~ S0 + P U,  P = E * (Q K^T)                (C, Dv)  P lower incl. diagonal
//   S_L = exp(G_L) S0 + K~^T U                         (Dk, Dv)
// Every exponent is <= 0 (g <= 0 and j <= i), so no exp overflows.
//
// Forward, three phases:
//   1. (chunk, head) in parallel: T, W_v, W_k.          O(C^2 (Dk + Dv)) each
//   2. (document, head) in parallel, chunks in order:   O(C Dk Dv) each
//      keep S0 per chunk, U = W_v - W_k S0, S_L.
//   3. (chunk, head) in parallel: O = Q~ S0 + P U (E again, not T).
// Memory: W_v (overwritten by U) and W_k, O(T Hv (Dk + Dv)), during the
// forward; the per-chunk states O(chunks Hv Dk Dv) are kept for the backward.
//
// Backward. Given dO and dS_L (the gradient of the state a chunk ends with;
// for the last chunk of a document, the gradient of final_state):
//   dU   = P^T dO + K~ dS_L
//   dS0  = exp(G_L) dS_L + Q~^T dO - W_k^T dU           (chunks in reverse)
//   dP   = dO U^T,  dQ += (E * dP) K,  dK += (E * dP)^T Q
//   dQ_i += exp(G_i) S0 dO_i
//   dK~  = U dS_L^T,  dK_j += exp(G_L - G_j) dK~_j
//   dW_v = dU,  dW_k = -dU S0^T
//   dR   = T^T dW  (for R_v = beta v and R_k = beta exp(G) k)
//   dA   = -(dR_v W_v^T + dR_k W_k^T)  on the strict lower triangle
//   dV_i = beta_i dR_v_i,   dK_i += beta_i exp(G_i) dR_k_i,
//   dK  += D K + D^T K  with D_ij = dA_ij beta_i E_ij,
//   dbeta_i = v_i . dR_v_i + exp(G_i) k_i . dR_k_i + sum_j dA_ij E_ij k_i . k_j
// and dG, the gradient of the cumulative log decay, collects from every
// exp(G_i - G_j) factor x: +x dx at i and -x dx at j (P, A, K~ and the inter-chunk
// terms), after which dg_j = sum_{i >= j} dG_i within the chunk. Then the
// L2 norms: for y = x r, r = (x . x + eps)^-1/2, dx = r (dy - y (y . dy)).
// Three phases again:
//   1. (chunk, head) in parallel: recompute T and W_k; dU_p = P^T dO and
//      X = Q~^T dO - W_k^T dU_p.
//   2. (document, head), chunks in reverse: Y = K~ dS_L, dU = dU_p + Y,
//      dS0 = exp(G_L) dS_L + X - W_k^T Y; keep dS_L per chunk.
//   3. (chunk, key head) in parallel, the group's value heads in order:
//      recompute T, W_v, W_k and U from the kept S0, then every gradient
//      above; the q and k gradients of the group are summed in the chunk and
//      go through the L2 norms' backward there.
// Nothing O(T^2) exists: the backward holds O(T Hv (Dk + Dv)) and
// O(chunks Hv Dk Dv), and recomputes the WY factors rather than keep them.
// q, k and v are read per chunk from the inputs as given (fp32 or bf16, any
// token and head strides) and normalised there; no normalised copy of the
// whole input exists.
//
// Determinism: each work item writes only its own rows, and every sum runs in
// a fixed order, so the result does not depend on the thread count.
// Products of the chunk tiles go to kernels/cpu/tile_product.h; the loops
// between them are row kernels (kernels/cpu/vec8.h), built for AVX2 + FMA and
// for the baseline: built for the baseline alone, the exps of E, the forward
// substitution for T and the masked sums of the backward took half of the
// fwd+bwd time at the tiny trainer's shape (Dk = Dv = 32).
#include "kernels/cpu/gated_delta_rule_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/tile_product.h"
#include "kernels/cpu/vec8.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kC = kGdrChunk;
static_assert(kC % kVec == 0, "chunk rows are walked in whole vectors");

BALLAST_VEC_INLINE float Dot(const float* a, const float* b, int64_t n) {
  Vec8f acc{};
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) acc += Load8(a + i) * Load8(b + i);
  float total = HorizontalSum(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// y[i] = alpha * x[i] (accumulate: y[i] += alpha * x[i]).
BALLAST_VEC_INLINE void Scale(float* y, const float* x, float alpha, int64_t n, bool accumulate) {
  int64_t i = 0;
  for (; i + kVec <= n; i += kVec) {
    const Vec8f s = Load8(x + i) * alpha;
    Store8(y + i, accumulate ? Load8(y + i) + s : s);
  }
  for (; i < n; ++i) y[i] = accumulate ? y[i] + alpha * x[i] : alpha * x[i];
}

// dst (cols, ld_dst) = src^T for src (rows, cols) with row stride ld_src.
void Transpose(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
               int64_t ld_dst) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[j * ld_dst + i] = src[i * ld_src + j];
}

// Rows of q, k or v as given: fp32 or bf16, unit stride in the head dim, any
// token and head strides (views of a fused projection are read in place).
struct Rows {
  const void* data = nullptr;
  int64_t s0 = 0, s1 = 0;
  bool bf16 = false;

  explicit Rows(const at::Tensor& x)
      : data(x.const_data_ptr()),
        s0(x.stride(0)),
        s1(x.stride(1)),
        bf16(x.scalar_type() == at::kBFloat16) {}
  // Row (t, h), n values, into dst as fp32.
  void Read(int64_t t, int64_t h, int64_t n, float* dst) const {
    const int64_t offset = t * s0 + h * s1;
    if (bf16) {
      const c10::BFloat16* src = static_cast<const c10::BFloat16*>(data) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
    } else {
      std::memcpy(dst, static_cast<const float*>(data) + offset, sizeof(float) * n);
    }
  }
};

// The problem's sizes, its chunks, and its inputs.
struct Problem {
  int64_t tokens, hk, hv, dk, dv, group, docs;
  float scale, eps;
  std::vector<GdrChunk> chunks;      // in token order
  std::vector<int64_t> first_chunk;  // (N + 1): document n's chunks are [first[n], first[n+1])
  Rows q, k, v;                      // as given
  at::Tensor g, beta;                // (T, Hv) fp32 contiguous

  int64_t ldv() const { return hv * dv; }  // row stride of (T, Hv, Dv) buffers
  int64_t ldw() const { return hv * dk; }  // row stride of (T, Hv, Dk) buffers
  int64_t state_size() const { return dk * dv; }
  int64_t num_chunks() const { return static_cast<int64_t>(chunks.size()); }
  at::TensorOptions f32() const { return g.options(); }
  // A per-document state (N, Hv, Dk, Dv): a fp32 copy of `given`, or zeros.
  at::Tensor StateOrZeros(const at::Tensor& given) const {
    return given.defined() ? given.to(at::kFloat).contiguous().clone()
                           : at::zeros({docs, hv, dk, dv}, f32());
  }
};

Problem MakeProblem(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                    const at::Tensor& g, const at::Tensor& beta, const at::Tensor& cu_seqlens,
                    double scale, double eps) {
  Problem p{.q = Rows(q), .k = Rows(k), .v = Rows(v)};
  p.tokens = q.size(0);
  p.hk = q.size(1);
  p.dk = q.size(2);
  p.hv = v.size(1);
  p.dv = v.size(2);
  p.group = p.hv / p.hk;
  p.scale = static_cast<float>(scale);
  p.eps = static_cast<float>(eps);
  GdrChunkTable table = gdr_chunk_table(cu_seqlens);
  p.chunks = std::move(table.chunks);
  p.first_chunk = std::move(table.first);
  p.docs = static_cast<int64_t>(p.first_chunk.size()) - 1;
  p.g = g.to(at::kFloat).contiguous();
  p.beta = beta.to(at::kFloat).contiguous();
  return p;
}

// The tiles of one (chunk, value head), and the steps of the formulas above.
// One per thread; Load() points it at a chunk. The chunk's q and k rows are
// read and normalised here, per chunk, rather than kept for the whole input.
class ChunkWork {
 public:
  explicit ChunkWork(const Problem& p)
      : p_(p),
        xq_(kC * p.dk),
        xk_(kC * p.dk),
        qs_(kC * p.dk),
        ks_(kC * p.dk),
        vs_(kC * p.dv),
        rq_(kC),
        rk_norm_(kC),
        cum_(kC),
        eg_(kC),
        tail_(kC),
        b_(kC),
        decay_(kC * kC),
        gram_(kC * kC),
        tinv_(kC * kC),
        arow_(kC),
        kt_(p.dk * kC),
        rk_(kC * p.dk),
        rv_(kC * p.dv),
        ktilde_(kC * p.dk) {}

  // Chunk c for value head h: q and k of its key head normalised (read again
  // only when the chunk or the key head changes), v, the decays and beta.
  BALLAST_ROW_KERNEL void Load(const GdrChunk& c, int64_t h) {
    const int64_t kh = h / p_.group, dk = p_.dk;
    if (c.begin != begin_ || kh != kh_ || c.length != len_) {
      for (int64_t i = 0; i < c.length; ++i) {
        float* xq = xq_.data() + i * dk;
        float* xk = xk_.data() + i * dk;
        p_.q.Read(c.begin + i, kh, dk, xq);
        p_.k.Read(c.begin + i, kh, dk, xk);
        rq_[i] = 1.0f / std::sqrt(Dot(xq, xq, dk) + p_.eps);
        rk_norm_[i] = 1.0f / std::sqrt(Dot(xk, xk, dk) + p_.eps);
        Scale(qs_.data() + i * dk, xq, rq_[i] * p_.scale, dk, false);
        Scale(ks_.data() + i * dk, xk, rk_norm_[i], dk, false);
      }
    }
    h_ = h;
    kh_ = kh;
    len_ = c.length;
    begin_ = c.begin;
    for (int64_t i = 0; i < len_; ++i) p_.v.Read(c.begin + i, h, p_.dv, vs_.data() + i * p_.dv);
    const float* g = p_.g.const_data_ptr<float>() + c.begin * p_.hv + h;
    const float* beta = p_.beta.const_data_ptr<float>() + c.begin * p_.hv + h;
    float running = 0.0f;
    for (int64_t i = 0; i < len_; ++i) {
      running += g[i * p_.hv];
      cum_[i] = running;
      eg_[i] = std::exp(running);
      b_[i] = beta[i * p_.hv];
    }
    for (int64_t i = 0; i < len_; ++i) tail_[i] = std::exp(cum_[len_ - 1] - cum_[i]);
    // K~ = exp(G_L - G) k.
    for (int64_t i = 0; i < len_; ++i)
      Scale(ktilde_.data() + i * p_.dk, k_ + i * p_.dk, tail_[i], p_.dk, false);
  }

  // E_ij = exp(G_i - G_j) on j <= i, else 0, in every row's first n columns
  // rounded up to whole vectors, and K^T (Dk, C).
  BALLAST_ROW_KERNEL void Decay() {
    const int64_t n = len_;
    for (int64_t i = 0; i < n; ++i) {
      float* row = decay_.data() + i * kC;
      int64_t j = 0;
      for (; j + kVec <= i + 1; j += kVec) Store8(row + j, Exp8(cum_[i] - Load8(cum_.data() + j)));
      if (j <= i) {  // the vector holding the diagonal: the lanes past i are 0
        Vec8f e = Exp8(cum_[i] - Load8(cum_.data() + j));
        for (int64_t t = i + 1 - j; t < kVec; ++t) e[t] = 0.0f;
        Store8(row + j, e);
        j += kVec;
      }
      for (; j < n; j += kVec) Store8(row + j, Vec8f{});
    }
    Transpose(k_, p_.dk, n, p_.dk, kt_.data(), kC);
  }

  // k . k (C, C) and T = (I + A)^-1, after Decay.
  BALLAST_ROW_KERNEL void Invert() {
    const int64_t n = len_;
    TileProduct(n, n, p_.dk, 1.0f, k_, p_.dk, 1, kt_.data(), kC, false, gram_.data(), kC);
    // T row by row: T_i = e_i - sum_{m < i} A_im T_m (forward substitution).
    // Row m of T is 0 past m, so a vector of T_i's columns [j, j + 8) takes
    // only the rows m >= j; two sums halve the chain of dependent FMAs.
    float* a = arow_.data();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t m = 0; m < i; m += kVec) {
        const int64_t at = i * kC + m;
        Store8(a + m, b_[i] * Load8(decay_.data() + at) * Load8(gram_.data() + at));
      }
      float* ti = tinv_.data() + i * kC;
      int64_t j = 0;
      for (; j <= i; j += kVec) {
        Vec8f even{}, odd{};
        if (i < j + kVec) even[i - j] = 1.0f;
        int64_t m = j;
        for (; m + 1 < i; m += 2) {
          even -= a[m] * Load8(tinv_.data() + m * kC + j);
          odd -= a[m + 1] * Load8(tinv_.data() + (m + 1) * kC + j);
        }
        if (m < i) even -= a[m] * Load8(tinv_.data() + m * kC + j);
        Store8(ti + j, even + odd);
      }
      for (; j < n; j += kVec) Store8(ti + j, Vec8f{});
    }
  }

  // W_v = T (beta v) and W_k = T (beta exp(G) k) where asked for (W_v (L, Dv)
  // at wv with row stride ld_wv; W_k likewise), after Invert.
  BALLAST_ROW_KERNEL void Wy(float* wv, int64_t ld_wv, float* wk, int64_t ld_wk) {
    const int64_t dk = p_.dk, dv = p_.dv, n = len_;
    if (wv != nullptr) {
      for (int64_t i = 0; i < n; ++i) Scale(rv_.data() + i * dv, v_ + i * dv, b_[i], dv, false);
      TileProduct(n, dv, n, 1.0f, tinv_.data(), kC, 1, rv_.data(), dv, false, wv, ld_wv);
    }
    if (wk != nullptr) {
      for (int64_t i = 0; i < n; ++i)
        Scale(rk_.data() + i * dk, k_ + i * dk, b_[i] * eg_[i], dk, false);
      TileProduct(n, dk, n, 1.0f, tinv_.data(), kC, 1, rk_.data(), dk, false, wk, ld_wk);
    }
  }

  // E, K^T, k . k, T, and W_v, W_k where asked for.
  void Factor(float* wv, int64_t ld_wv, float* wk, int64_t ld_wk) {
    Decay();
    Invert();
    Wy(wv, ld_wv, wk, ld_wk);
  }

  // P = E * (Q K^T) into p (C, C), after Decay (which made K^T); qk keeps Q K^T.
  BALLAST_ROW_KERNEL void Attention(float* qk, float* p) const {
    const int64_t n = len_;
    TileProduct(n, n, p_.dk, 1.0f, q_, p_.dk, 1, kt_.data(), kC, false, qk, kC);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) p[i * kC + j] = qk[i * kC + j] * decay_[i * kC + j];
  }

  // Q~ = exp(G) q into out (L, Dk).
  BALLAST_ROW_KERNEL void DecayedQueries(float* out) const {
    for (int64_t i = 0; i < len_; ++i) Scale(out + i * p_.dk, q_ + i * p_.dk, eg_[i], p_.dk, false);
  }

  const Problem& p_;
  int64_t h_ = -1, kh_ = -1, len_ = 0, begin_ = -1;
  std::vector<float> xq_, xk_;       // (C, Dk) q and k as read, fp32
  std::vector<float> qs_, ks_;       // (C, Dk) x r (q also times scale)
  std::vector<float> vs_;            // (C, Dv)
  std::vector<float> rq_, rk_norm_;  // (C) r = (x . x + eps)^-1/2
  const float* q_ = qs_.data();      // the chunk's rows, contiguous
  const float* k_ = ks_.data();
  const float* v_ = vs_.data();
  std::vector<float> cum_, eg_, tail_, b_;
  std::vector<float> decay_, gram_, tinv_;  // (C, C)
  std::vector<float> arow_;                 // (C) a row of A
  std::vector<float> kt_;                   // (Dk, C)
  std::vector<float> rk_, rv_;              // (C, Dk), (C, Dv)
  std::vector<float> ktilde_;               // (C, Dk)
};

// Runs body(chunk_work, chunk_index, head) for every (chunk, head), in parallel.
template <typename Body>
void ForEachChunkHead(const Problem& p, const Body& body) {
  const int64_t items = static_cast<int64_t>(p.chunks.size()) * p.hv;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    ChunkWork work(p);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item / p.hv, h = item % p.hv;
      work.Load(p.chunks[c], h);
      body(work, c, h);
    }
  });
}

// Runs body(chunk_work, document, head) for every (document, head), in parallel.
template <typename Body>
void ForEachDocumentHead(const Problem& p, const Body& body) {
  at::parallel_for(0, p.docs * p.hv, 1, [&](int64_t begin, int64_t end) {
    ChunkWork work(p);
    for (int64_t item = begin; item < end; ++item) body(work, item / p.hv, item % p.hv);
  });
}

// Runs body(chunk_work, chunk_index, head, row, P, Q~) for every (chunk,
// head), in parallel, once the chunk's P = E * (Q K^T) (C, C) and Q~ (L, Dk)
// are made; W_k goes to the rows of wk (a (T, Hv, Dk) buffer) where given.
template <typename Body>
void ForEachChunkAttention(const Problem& p, float* wk, const Body& body) {
  at::parallel_for(0, p.num_chunks() * p.hv, 1, [&](int64_t begin, int64_t end) {
    ChunkWork w(p);
    std::vector<float> qk(kC * kC), pm(kC * kC), qtilde(kC * p.dk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item / p.hv, h = item % p.hv;
      w.Load(p.chunks[c], h);
      const int64_t row = p.chunks[c].begin * p.hv + h;
      w.Decay();
      if (wk != nullptr) {
        w.Invert();
        w.Wy(nullptr, 0, wk + row * p.dk, p.ldw());
      }
      w.Attention(qk.data(), pm.data());
      w.DecayedQueries(qtilde.data());
      body(w, c, h, row, pm.data(), qtilde.data());
    }
  });
}

// Backward phase 3 for one (chunk, key head): every gradient of the group's
// value heads, one after the other (in order, so that the sums do not depend
// on the threads), their q and k gradients summed in the chunk, then the L2
// norms' backward, dx = r (dy - y (y . dy)) with y = x r (dy times scale for q).
// One per thread, with its tiles.
class ChunkGrads {
 public:
  struct Io {
    const float* states;    // (chunks, Hv, Dk, Dv) S0
    const float* d_states;  // (chunks, Hv, Dk, Dv) dS_L
    const float* d_out;     // (T, Hv, Dv)
    const float* du;        // (T, Hv, Dv)
    float *dq, *dk, *dv, *dg, *dbeta;
  };

  ChunkGrads(const Problem& p, const Io& io)
      : p_(p),
        io_(io),
        qk_(kC * kC),
        pm_(kC * kC),
        dp_(kC * kC),
        da_(kC * kC),
        wv_(kC * p.dv),
        wk_(kC * p.dk),
        u_(kC * p.dv),
        ut_(p.dv * kC),
        wvt_(p.dv * kC),
        wkt_(p.dk * kC),
        s0t_(p.dv * p.dk),
        dst_(p.dv * p.dk),
        raw_(kC * p.dk),
        dktilde_(kC * p.dk),
        dwk_(kC * p.dk),
        drv_(kC * p.dv),
        drk_(kC * p.dk),
        dq_(kC * p.dk),
        dkk_(kC * p.dk),
        dG_(kC),
        db_(kC),
        columns_(kC) {}

  BALLAST_ROW_KERNEL void Run(ChunkWork& w, int64_t c, int64_t kh) {
    const GdrChunk& chunk = p_.chunks[c];
    const int64_t n = chunk.length, dk = p_.dk;
    std::fill(dq_.begin(), dq_.end(), 0.0f);
    std::fill(dkk_.begin(), dkk_.end(), 0.0f);
    for (int64_t h = kh * p_.group; h < (kh + 1) * p_.group; ++h) ValueHead(w, c, h);
    // The L2 norms: y = x r is the normalised row (q_ also carries scale).
    for (int64_t i = 0; i < n; ++i) {
      for (int pass = 0; pass < 2; ++pass) {
        const float* x = (pass == 0 ? w.xq_ : w.xk_).data() + i * dk;
        const float r = (pass == 0 ? w.rq_ : w.rk_norm_)[i];
        float* dy = (pass == 0 ? dq_ : dkk_).data() + i * dk;
        if (pass == 0) Scale(dy, dy, p_.scale, dk, false);
        const float c_dot = r * Dot(x, dy, dk);  // y . dy
        float* dx = (pass == 0 ? io_.dq : io_.dk) + ((chunk.begin + i) * p_.hk + kh) * dk;
        for (int64_t d = 0; d < dk; ++d) dx[d] = r * (dy[d] - x[d] * r * c_dot);
      }
    }
  }

 private:
  BALLAST_VEC_INLINE void ValueHead(ChunkWork& w, int64_t c, int64_t h) {
    const GdrChunk& chunk = p_.chunks[c];
    const int64_t n = chunk.length, last = n - 1, dk = p_.dk, dv = p_.dv, hv = p_.hv,
                  ss = p_.state_size();
    w.Load(chunk, h);
    const int64_t row = chunk.begin * hv + h, ldv = p_.ldv();
    const float* s0 = io_.states + (c * hv + h) * ss;
    const float* ds = io_.d_states + (c * hv + h) * ss;  // dS_L
    const float* d_o_rows = io_.d_out + row * dv;
    const float* du_rows = io_.du + row * dv;
    w.Factor(wv_.data(), dv, wk_.data(), dk);
    w.Attention(qk_.data(), pm_.data());
    // U = W_v - W_k S0.
    std::memcpy(u_.data(), wv_.data(), sizeof(float) * n * dv);
    TileProduct(n, dv, dk, -1.0f, wk_.data(), dk, 1, s0, dv, true, u_.data(), dv);
    Transpose(u_.data(), dv, n, dv, ut_.data(), kC);
    Transpose(wv_.data(), dv, n, dv, wvt_.data(), kC);
    Transpose(wk_.data(), dk, n, dk, wkt_.data(), kC);
    Transpose(s0, dv, dk, dv, s0t_.data(), dk);
    Transpose(ds, dv, dk, dv, dst_.data(), dk);
    float* dG = dG_.data();
    float* db = db_.data();
    std::fill(dG, dG + n, 0.0f);
    std::fill(db, db + n, 0.0f);
    // Each exp(G_i - G_j) factor x with gradient dx puts +x dx on dG_i and
    // -x dx on dG_j: the second kind is summed by column, then subtracted.
    std::fill(columns_.begin(), columns_.end(), 0.0f);
    float* columns = columns_.data();

    // dP = dO U^T on j <= i, times E; dQ += (E dP) K, dK += (E dP)^T Q.
    TileProduct(n, n, dv, 1.0f, d_o_rows, ldv, 1, ut_.data(), kC, false, dp_.data(), kC);
    for (int64_t i = 0; i < n; ++i) {
      float* dpi = dp_.data() + i * kC;
      const float* ei = w.decay_.data() + i * kC;
      const float* qki = qk_.data() + i * kC;
      Vec8f row_sum{};
      for (int64_t j = 0; j < n; j += kVec) {
        const Vec8f e = Load8(dpi + j) * Load8(ei + j);
        Store8(dpi + j, e);
        if (j >= i) continue;  // only j < i carries a decay factor
        Vec8f t = e * Load8(qki + j);
        for (int64_t l = i - j; l < kVec; ++l) t[l] = 0.0f;
        row_sum += t;
        Store8(columns + j, Load8(columns + j) + t);
      }
      dG[i] += HorizontalSum(row_sum);
    }
    TileProduct(n, dk, n, 1.0f, dp_.data(), kC, 1, w.k_, dk, true, dq_.data(), dk);
    TileProduct(n, dk, n, 1.0f, dp_.data(), 1, kC, w.q_, dk, true, dkk_.data(), dk);
    // Inter-chunk read: dQ_i += exp(G_i) S0 dO_i.
    TileProduct(n, dk, dv, 1.0f, d_o_rows, ldv, 1, s0t_.data(), dk, false, raw_.data(), dk);
    for (int64_t i = 0; i < n; ++i) {
      dG[i] += w.eg_[i] * Dot(w.q_ + i * dk, raw_.data() + i * dk, dk);
      Scale(dq_.data() + i * dk, raw_.data() + i * dk, w.eg_[i], dk, true);
    }
    // The state written: dK~ = U dS_L^T; dK_j += exp(G_L - G_j) dK~_j.
    TileProduct(n, dk, dv, 1.0f, u_.data(), dv, 1, dst_.data(), dk, false, dktilde_.data(), dk);
    for (int64_t j = 0; j < n; ++j) {
      const float* x = dktilde_.data() + j * dk;
      const float t = w.tail_[j] * Dot(w.k_ + j * dk, x, dk);
      Scale(dkk_.data() + j * dk, x, w.tail_[j], dk, true);
      dG[last] += t;
      dG[j] -= t;
    }
    dG[last] += w.eg_[last] * Dot(s0, ds, ss);
    // dW_k = -dU S0^T; dR = T^T dW.
    TileProduct(n, dk, dv, -1.0f, du_rows, ldv, 1, s0t_.data(), dk, false, dwk_.data(), dk);
    TileProduct(n, dv, n, 1.0f, w.tinv_.data(), 1, kC, du_rows, ldv, false, drv_.data(), dv);
    TileProduct(n, dk, n, 1.0f, w.tinv_.data(), 1, kC, dwk_.data(), dk, false, drk_.data(), dk);
    for (int64_t i = 0; i < n; ++i) {
      Scale(io_.dv + (row + i * hv) * dv, drv_.data() + i * dv, w.b_[i], dv, false);
      db[i] += Dot(w.v_ + i * dv, drv_.data() + i * dv, dv);
      Scale(dkk_.data() + i * dk, drk_.data() + i * dk, w.b_[i] * w.eg_[i], dk, true);
      const float t = w.eg_[i] * Dot(w.k_ + i * dk, drk_.data() + i * dk, dk);
      db[i] += t;
      dG[i] += w.b_[i] * t;
    }
    // dA = -(dR_v W_v^T + dR_k W_k^T) on j < i (0 elsewhere); D = dA beta_i E.
    TileProduct(n, n, dv, -1.0f, drv_.data(), dv, 1, wvt_.data(), kC, false, da_.data(), kC);
    TileProduct(n, n, dk, -1.0f, drk_.data(), dk, 1, wkt_.data(), kC, true, da_.data(), kC);
    for (int64_t i = 0; i < n; ++i) {
      float* dai = da_.data() + i * kC;
      const float* ei = w.decay_.data() + i * kC;
      const float* gi = w.gram_.data() + i * kC;
      Vec8f gram_sum{}, row_sum{};
      for (int64_t j = 0; j < n; j += kVec) {
        if (j >= i) {
          Store8(dai + j, Vec8f{});
          continue;
        }
        Vec8f x = Load8(dai + j) * Load8(ei + j);
        for (int64_t l = i - j; l < kVec; ++l) x[l] = 0.0f;
        const Vec8f xg = x * Load8(gi + j);
        gram_sum += xg;
        Store8(dai + j, x * w.b_[i]);
        const Vec8f t = xg * w.b_[i];
        row_sum += t;
        Store8(columns + j, Load8(columns + j) + t);
      }
      db[i] += HorizontalSum(gram_sum);
      dG[i] += HorizontalSum(row_sum);
    }
    TileProduct(n, dk, n, 1.0f, da_.data(), kC, 1, w.k_, dk, true, dkk_.data(), dk);
    TileProduct(n, dk, n, 1.0f, da_.data(), 1, kC, w.k_, dk, true, dkk_.data(), dk);
    // dg_j = sum_{i >= j} dG_i.
    float suffix = 0.0f;
    for (int64_t i = n - 1; i >= 0; --i) {
      suffix += dG[i] - columns[i];
      io_.dg[(chunk.begin + i) * hv + h] = suffix;
      io_.dbeta[(chunk.begin + i) * hv + h] = db[i];
    }
  }

  const Problem& p_;
  const Io io_;
  std::vector<float> qk_, pm_, dp_, da_;                // (C, C)
  std::vector<float> wv_, wk_, u_;                      // (C, Dv), (C, Dk), (C, Dv)
  std::vector<float> ut_, wvt_, wkt_;                   // transposed: (Dv or Dk, C)
  std::vector<float> s0t_, dst_;                        // S0^T, dS_L^T (Dv, Dk)
  std::vector<float> raw_, dktilde_, dwk_, drv_, drk_;  // (C, Dk or Dv)
  std::vector<float> dq_, dkk_;                         // (C, Dk) the group's sums
  std::vector<float> dG_, db_, columns_;                // (C)
};

}  // namespace

GdrChunkTable gdr_chunk_table(const at::Tensor& cu_seqlens) {
  const at::Tensor cu = cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  GdrChunkTable table;
  for (int64_t n = 0; n + 1 < cu.numel(); ++n) {
    table.first.push_back(static_cast<int64_t>(table.chunks.size()));
    for (int64_t t = c[n]; t < c[n + 1]; t += kC)
      table.chunks.push_back({t, std::min(kC, c[n + 1] - t)});
  }
  table.first.push_back(static_cast<int64_t>(table.chunks.size()));
  return table;
}

GdrForward gated_delta_rule_cpu_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                        const at::Tensor& initial_state, double scale,
                                        double l2norm_eps) {
  const Problem p = MakeProblem(q, k, v, g, beta, cu_seqlens, scale, l2norm_eps);
  const int64_t dk = p.dk, dv = p.dv, hv = p.hv, ss = p.state_size(), chunks = p.num_chunks();
  const at::TensorOptions f32 = p.f32();
  GdrForward result;
  result.chunk_states = at::empty({chunks, hv, dk, dv}, f32);
  result.final_state = p.StateOrZeros(initial_state);
  at::Tensor wv = at::empty({p.tokens, hv, dv}, f32);  // W_v, then U
  at::Tensor wk = at::empty({p.tokens, hv, dk}, f32);  // W_k
  at::Tensor out = at::empty({p.tokens, hv, dv}, f32);
  float* wvp = wv.mutable_data_ptr<float>();
  float* wkp = wk.mutable_data_ptr<float>();
  float* outp = out.mutable_data_ptr<float>();
  float* states = result.chunk_states.mutable_data_ptr<float>();
  float* finals = result.final_state.mutable_data_ptr<float>();

  // 1. W_v, W_k per (chunk, head).
  ForEachChunkHead(p, [&](ChunkWork& w, int64_t c, int64_t h) {
    const int64_t row = p.chunks[c].begin * hv + h;
    w.Factor(wvp + row * dv, p.ldv(), wkp + row * dk, p.ldw());
  });
  // 2. The states, chunk after chunk: U = W_v - W_k S0, S_L = exp(G_L) S0 + K~^T U.
  ForEachDocumentHead(p, [&](ChunkWork& w, int64_t n, int64_t h) {
    float* s = finals + (n * hv + h) * ss;
    for (int64_t c = p.first_chunk[n]; c < p.first_chunk[n + 1]; ++c) {
      w.Load(p.chunks[c], h);
      const int64_t row = p.chunks[c].begin * hv + h, len = w.len_;
      std::memcpy(states + (c * hv + h) * ss, s, sizeof(float) * ss);
      TileProduct(len, dv, dk, -1.0f, wkp + row * dk, p.ldw(), 1, s, dv, true, wvp + row * dv,
                  p.ldv());
      Scale(s, s, w.eg_[len - 1], ss, false);
      TileProduct(dk, dv, len, 1.0f, w.ktilde_.data(), 1, dk, wvp + row * dv, p.ldv(), true, s, dv);
    }
  });
  wk.reset();
  // 3. O = Q~ S0 + P U per (chunk, head).
  ForEachChunkAttention(
      p, nullptr,
      [&](ChunkWork& w, int64_t c, int64_t h, int64_t row, const float* pm, const float* qtilde) {
        const int64_t len = w.len_;
        TileProduct(len, dv, dk, 1.0f, qtilde, dk, 1, states + (c * hv + h) * ss, dv, false,
                    outp + row * dv, p.ldv());
        TileProduct(len, dv, len, 1.0f, pm, kC, 1, wvp + row * dv, p.ldv(), true, outp + row * dv,
                    p.ldv());
      });
  result.out = out.to(v.scalar_type());
  return result;
}

GdrGrads gated_delta_rule_cpu_backward(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& g,
                                       const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                       const at::Tensor& chunk_states, const at::Tensor& d_out,
                                       const at::Tensor& d_final, double scale, double l2norm_eps) {
  const Problem p = MakeProblem(q, k, v, g, beta, cu_seqlens, scale, l2norm_eps);
  const int64_t dk = p.dk, dv = p.dv, hv = p.hv, ss = p.state_size(), chunks = p.num_chunks();
  const at::TensorOptions f32 = p.f32();
  const at::Tensor d_o =
      d_out.defined() ? d_out.to(at::kFloat).contiguous() : at::zeros({p.tokens, hv, dv}, f32);
  GdrGrads grads;
  grads.d_state = p.StateOrZeros(d_final);  // dS_L of each document's last chunk, then dS0
  at::Tensor du = at::empty({p.tokens, hv, dv}, f32);          // dU_p, then dU
  at::Tensor wk = at::empty({p.tokens, hv, dk}, f32);          // W_k
  at::Tensor d_states = at::empty({chunks, hv, dk, dv}, f32);  // X, then dS_L
  const float* dop = d_o.const_data_ptr<float>();
  const float* states = chunk_states.const_data_ptr<float>();
  float* dup = du.mutable_data_ptr<float>();
  float* wkp = wk.mutable_data_ptr<float>();
  float* dsp = d_states.mutable_data_ptr<float>();
  float* dfinal = grads.d_state.mutable_data_ptr<float>();

  // 1. dU_p = P^T dO and X = Q~^T dO - W_k^T dU_p per (chunk, head).
  ForEachChunkAttention(
      p, wkp,
      [&](ChunkWork& w, int64_t c, int64_t h, int64_t row, const float* pm, const float* qtilde) {
        const int64_t len = w.len_;
        float* x = dsp + (c * hv + h) * ss;
        TileProduct(len, dv, len, 1.0f, pm, 1, kC, dop + row * dv, p.ldv(), false, dup + row * dv,
                    p.ldv());
        TileProduct(dk, dv, len, 1.0f, qtilde, 1, dk, dop + row * dv, p.ldv(), false, x, dv);
        TileProduct(dk, dv, len, -1.0f, wkp + row * dk, 1, p.ldw(), dup + row * dv, p.ldv(), true,
                    x, dv);
      });
  // 2. Chunks in reverse: with Y = K~ dS_L, dU = dU_p + Y and
  // dS0 = exp(G_L) dS_L + X - W_k^T Y (X holds the dU_p part already).
  ForEachDocumentHead(p, [&](ChunkWork& w, int64_t n, int64_t h) {
    float* ds = dfinal + (n * hv + h) * ss;
    std::vector<float> y(kC * dv);
    for (int64_t c = p.first_chunk[n + 1] - 1; c >= p.first_chunk[n]; --c) {
      w.Load(p.chunks[c], h);
      const int64_t row = p.chunks[c].begin * hv + h, len = w.len_;
      TileProduct(len, dv, dk, 1.0f, w.ktilde_.data(), dk, 1, ds, dv, false, y.data(), dv);
      for (int64_t i = 0; i < len; ++i)
        Scale(dup + row * dv + i * p.ldv(), y.data() + i * dv, 1.0f, dv, true);
      float* slot = dsp + (c * hv + h) * ss;
      const float decay = w.eg_[len - 1];
      for (int64_t i = 0; i < ss; ++i) {
        const float x = slot[i];
        slot[i] = ds[i];
        ds[i] = decay * ds[i] + x;
      }
      TileProduct(dk, dv, len, -1.0f, wkp + row * dk, 1, p.ldw(), y.data(), dv, true, ds, dv);
    }
  });
  wk.reset();

  // 3. Every gradient per (chunk, key head): the value heads of the group
  // one after the other (in order, so that the sums do not depend on the
  // threads), their q and k gradients summed in the chunk, then the L2 norms'
  // backward, dx = r (dy - y (y . dy)) with y = x r (dy times scale for q).
  at::Tensor dq_out = at::empty({p.tokens, p.hk, dk}, f32);
  at::Tensor dk_out = at::empty({p.tokens, p.hk, dk}, f32);
  at::Tensor dvv = at::empty({p.tokens, hv, dv}, f32);
  at::Tensor dgv = at::empty({p.tokens, hv}, f32);
  at::Tensor dbv = at::empty({p.tokens, hv}, f32);
  const ChunkGrads::Io io{states,
                          dsp,
                          dop,
                          dup,
                          dq_out.mutable_data_ptr<float>(),
                          dk_out.mutable_data_ptr<float>(),
                          dvv.mutable_data_ptr<float>(),
                          dgv.mutable_data_ptr<float>(),
                          dbv.mutable_data_ptr<float>()};
  at::parallel_for(0, chunks * p.hk, 1, [&](int64_t begin, int64_t end) {
    ChunkWork w(p);
    ChunkGrads grads_of(p, io);
    for (int64_t item = begin; item < end; ++item) grads_of.Run(w, item / p.hk, item % p.hk);
  });
  grads.d_q = dq_out.to(q.scalar_type());
  grads.d_k = dk_out.to(k.scalar_type());
  grads.d_v = dvv.to(v.scalar_type());
  grads.d_g = dgv.to(g.scalar_type());
  grads.d_beta = dbv.to(beta.scalar_type());
  return grads;
}

}  // namespace ballast::kernels
