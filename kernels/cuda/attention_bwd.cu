// Attention backward on CUDA: FlashAttention-2 gradients over an IntervalMask.
//
// Inputs: q (T, Hq, D), k and v (T, Hkv, D), out and grad_out dO (T, Hq, D),
// bf16 or fp16; lse (Hq, T) fp32 from the forward; key_ranges and
// query_ranges (T, 4) int64 from interval_mask(). With P = exp(S - lse)
// recomputed tile by tile (S = scale * Q K^T on the visible keys) and
// Delta_i = dO_i . O_i:
//   dV_j = sum_i P_ij dO_i           dS_ij = P_ij (dO_i . v_j - Delta_i)
//   dK_j = scale sum_i dS_ij q_i     dQ_i  = scale sum_j dS_ij k_j
// A row with lse = -inf saw no key: its P is 0 (exp2(s - +inf), never
// exp(-inf - -inf) = NaN), so it gets gradient 0 and contributes nothing.
//
// Three launches, no atomics, so the gradients are deterministic:
//   1. Delta (Hq, T) in fp32, one warp per (token, head).
//   2. dK, dV: one block per (key tile, kv head). It keeps its K and V tile
//      and fp32 dK, dV accumulators in shared memory and walks every query
//      head of its GQA group and every query tile in its tile's spans (the
//      hull of its keys' query_ranges), skipping query tiles that see none
//      of its keys. GQA's sum over the heads of a group happens here, in fp32.
//   3. dQ: one block per (query tile, query head), walking key tiles like the
//      forward. This recomputes S and dP once more (7 tile products instead
//      of FlashAttention-2's 5 with fp32 atomics on dQ) in exchange for a
//      result independent of scheduling and no (T, Hq, D) fp32 scratch.
//
// Precision: products on tensor cores with bf16 / fp16 operands and fp32
// accumulation; S, P, dP, dS, Delta and the accumulators are fp32; P and dS
// are rounded to the input dtype as operands of the next product, as in
// FlashAttention-2. Indexing: global offsets are int64.

#include <cmath>
#include <limits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cuda.h"

namespace ballast::kernels {
namespace attention_cuda {
namespace {

namespace wmma = nvcuda::wmma;

struct BackwardParams {
  const void* q;              // (T, Hq, D)
  const void* k;              // (T, Hkv, D)
  const void* v;              // (T, Hkv, D)
  const void* dout;           // (T, Hq, D)
  const float* lse;           // (Hq, T)
  const float* delta;         // (Hq, T)
  void* dq;                   // (T, Hq, D)
  void* dk;                   // (T, Hkv, D)
  void* dv;                   // (T, Hkv, D)
  const int64_t* key_ranges;  // (T, 4)
  const TileItem* items;      // (gridDim.x)
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  float scale;
  float scale_log2;  // scale * log2(e)
};

// delta (Hq, T) = rowsum(dO * O), fp32; one warp per (token, head) row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionDeltaKernel(const T* dout, const T* out, float* delta, int64_t num_tokens,
                         int64_t num_heads, int head_dim) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= num_tokens * num_heads) return;
  const T* a = dout + row * head_dim;
  const T* b = out + row * head_dim;
  float sum = 0.0f;
  for (int c = lane; c < head_dim; c += 32) sum += ToFloat(a[c]) * ToFloat(b[c]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
  if (lane == 0) delta[(row % num_heads) * num_tokens + row / num_heads] = sum;
}

// Loads, for query rows [r0, r0 + rows) of head h, log2-domain lse with the
// empty-row guard (+inf for lse = -inf and for padded rows, so that
// exp2(s - lse2) = 0) and Delta (0 for padded rows).
template <int kRows>
__device__ __forceinline__ void LoadRowStats(float* lse2_s, float* delta_s, const BackwardParams& p,
                                             int64_t h, int64_t r0, int rows) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const float lse = r < rows ? p.lse[h * p.num_tokens + r0 + r] : -kInf;
    lse2_s[r] = lse == -kInf ? kInf : lse * kLog2e;
    delta_s[r] = r < rows ? p.delta[h * p.num_tokens + r0 + r] : 0.0f;
  }
}

// For each row of a (kRows, kCols32 * 32) score tile: P = exp2(S scale_log2
// - lse2) on the visible keys and 0 elsewhere, dS = P (dP - Delta). Writes dS
// (and P when p_out is not null) in T over the rows of s, with row stride
// 2 * ld_s: row r of the T tile lies inside row r of the fp32 tile, and each
// row is read whole before it is overwritten.
template <typename T, int kRows, int kCols>
__device__ __forceinline__ void SoftmaxGradTile(float* s, const float* dp, int ld_s, T* ds_out,
                                                T* p_out, const int64_t* ranges_s,
                                                const float* lse2_s, const float* delta_s,
                                                int64_t c0, int valid_cols, float scale_log2) {
  static_assert(kCols % 32 == 0, "columns per lane");
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int r = warp; r < kRows; r += kWarps) {
    const int64_t* rr = ranges_s + 4 * r;
    float pv[kCols / 32];
    float dsv[kCols / 32];
#pragma unroll
    for (int t = 0; t < kCols / 32; ++t) {
      const int jj = lane + 32 * t;
      const bool visible = jj < valid_cols && Sees(rr, c0 + jj);
      pv[t] = visible ? exp2f(s[r * ld_s + jj] * scale_log2 - lse2_s[r]) : 0.0f;
      dsv[t] = pv[t] * (dp[r * ld_s + jj] - delta_s[r]);
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kCols / 32; ++t) {
      const int jj = lane + 32 * t;
      ds_out[r * 2 * ld_s + jj] = FromFloat<T>(dsv[t]);
      if (p_out != nullptr) p_out[r * 2 * ld_s + jj] = FromFloat<T>(pv[t]);
    }
  }
}

// ---------------------------------------------------------------------------
// dK, dV
// ---------------------------------------------------------------------------

template <typename T, int kHeadDim, int kBlockN, int kBlockM>
struct KeyValueLayout {
  static constexpr int kLdT = kHeadDim + kPadHalf;
  static constexpr int kLdS = kBlockN + kPadFloat;
  static constexpr int kLdP = 2 * kLdS;
  static constexpr int kLdO = kHeadDim + kPadFloat;
  static constexpr int kK = 0;                                                   // (kBlockN, kLdT)
  static constexpr int kV = AlignUp(kK + kBlockN * kLdT * sizeof(T));            // (kBlockN, kLdT)
  static constexpr int kDk = AlignUp(kV + kBlockN * kLdT * sizeof(T));           // (kBlockN, kLdO)
  static constexpr int kDv = AlignUp(kDk + kBlockN * kLdO * sizeof(float));      // (kBlockN, kLdO)
  static constexpr int kQ = AlignUp(kDv + kBlockN * kLdO * sizeof(float));       // (kBlockM, kLdT)
  static constexpr int kDo = AlignUp(kQ + kBlockM * kLdT * sizeof(T));           // (kBlockM, kLdT)
  static constexpr int kS = AlignUp(kDo + kBlockM * kLdT * sizeof(T));           // (kBlockM, kLdS)
  static constexpr int kDp = AlignUp(kS + kBlockM * kLdS * sizeof(float));       // (kBlockM, kLdS)
  static constexpr int kRanges = AlignUp(kDp + kBlockM * kLdS * sizeof(float));  // (kBlockM, 4)
  static constexpr int kLse = AlignUp(kRanges + kBlockM * 4 * sizeof(int64_t));  // (kBlockM)
  static constexpr int kDelta = AlignUp(kLse + kBlockM * sizeof(float));         // (kBlockM)
  static constexpr int kBytes = AlignUp(kDelta + kBlockM * sizeof(float));
  static_assert(kBytes <= kMaxSmemSm80, "dK/dV tiles must fit sm_80 shared memory");
  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(kBlockM % 16 == 0 && kBlockN % 32 == 0, "rows in wmma tiles, columns per lane");
  static_assert(kBlockM <= kThreads, "one thread per query row tests a key tile");
};

template <typename T, int kHeadDim, int kBlockN, int kBlockM>
__global__ void __launch_bounds__(kThreads) AttentionKeyValueGradKernel(const BackwardParams p) {
  using L = KeyValueLayout<T, kHeadDim, kBlockN, kBlockM>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* k_s = reinterpret_cast<T*>(smem + L::kK);            // (kBlockN, kHeadDim)
  T* v_s = reinterpret_cast<T*>(smem + L::kV);            // (kBlockN, kHeadDim)
  float* dk_s = reinterpret_cast<float*>(smem + L::kDk);  // (kBlockN, kHeadDim)
  float* dv_s = reinterpret_cast<float*>(smem + L::kDv);  // (kBlockN, kHeadDim)
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);            // (kBlockM, kHeadDim)
  T* do_s = reinterpret_cast<T*>(smem + L::kDo);          // (kBlockM, kHeadDim)
  float* s_s = reinterpret_cast<float*>(smem + L::kS);    // (kBlockM, kBlockN) S
  T* p_s = reinterpret_cast<T*>(smem + L::kS);            // (kBlockM, kBlockN) P over S
  float* dp_s = reinterpret_cast<float*>(smem + L::kDp);  // (kBlockM, kBlockN) dP
  T* ds_s = reinterpret_cast<T*>(smem + L::kDp);          // (kBlockM, kBlockN) dS over dP
  int64_t* ranges_s = reinterpret_cast<int64_t*>(smem + L::kRanges);  // (kBlockM, 4)
  float* lse2_s = reinterpret_cast<float*>(smem + L::kLse);           // (kBlockM)
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);        // (kBlockM)

  const TileItem item = p.items[blockIdx.x];
  const int64_t g = blockIdx.y;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t ldq = p.num_heads * kHeadDim;
  const int64_t ldk = p.num_kv_heads * kHeadDim;
  const int64_t c0 = item.begin;
  const int64_t c1 = item.end;
  const int keys = static_cast<int>(c1 - c0);

  LoadTileAsync<T, kBlockN, kHeadDim>(
      k_s, L::kLdT, static_cast<const T*>(p.k) + c0 * ldk + g * kHeadDim, ldk, keys);
  LoadTileAsync<T, kBlockN, kHeadDim>(
      v_s, L::kLdT, static_cast<const T*>(p.v) + c0 * ldk + g * kHeadDim, ldk, keys);
  for (int idx = threadIdx.x; idx < kBlockN * L::kLdO; idx += kThreads) {
    dk_s[idx] = 0.0f;
    dv_s[idx] = 0.0f;
  }
  CpAsyncWaitAll();
  __syncthreads();

  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t sp = 0; sp < item.span_count; ++sp) {
      for (int64_t r0 = item.span_begin[sp]; r0 < item.span_end[sp]; r0 += kBlockM) {
        const int rows = static_cast<int>(min(r0 + kBlockM, item.span_end[sp]) - r0);
        LoadRanges<kBlockM>(ranges_s, p.key_ranges, r0, rows);
        __syncthreads();
        const bool meets = threadIdx.x < kBlockM && Meets(ranges_s + 4 * threadIdx.x, c0, c1);
        if (!__syncthreads_or(meets)) continue;

        LoadTileAsync<T, kBlockM, kHeadDim>(
            q_s, L::kLdT, static_cast<const T*>(p.q) + r0 * ldq + h * kHeadDim, ldq, rows);
        LoadTileAsync<T, kBlockM, kHeadDim>(
            do_s, L::kLdT, static_cast<const T*>(p.dout) + r0 * ldq + h * kHeadDim, ldq, rows);
        LoadRowStats<kBlockM>(lse2_s, delta_s, p, h, r0, rows);
        CpAsyncWaitAll();
        __syncthreads();

        // s (kBlockM, kBlockN) = Q (kBlockM, D) . K^T (D, kBlockN)
        BlockGemm<T, kBlockM, kBlockN, kHeadDim, wmma::row_major, wmma::col_major, false>(
            q_s, L::kLdT, k_s, L::kLdT, s_s, L::kLdS);
        // dp (kBlockM, kBlockN) = dO (kBlockM, D) . V^T (D, kBlockN)
        BlockGemm<T, kBlockM, kBlockN, kHeadDim, wmma::row_major, wmma::col_major, false>(
            do_s, L::kLdT, v_s, L::kLdT, dp_s, L::kLdS);
        __syncthreads();

        // Key columns past this tile's keys are padding: masked by valid_cols.
        SoftmaxGradTile<T, kBlockM, kBlockN>(s_s, dp_s, L::kLdS, ds_s, p_s, ranges_s, lse2_s,
                                             delta_s, c0, keys, p.scale_log2);
        __syncthreads();

        // dv (kBlockN, D) += P^T (kBlockN, kBlockM) . dO (kBlockM, D)
        BlockGemm<T, kBlockN, kHeadDim, kBlockM, wmma::col_major, wmma::row_major, true>(
            p_s, L::kLdP, do_s, L::kLdT, dv_s, L::kLdO);
        // dk (kBlockN, D) += dS^T (kBlockN, kBlockM) . Q (kBlockM, D); scaled at the end
        BlockGemm<T, kBlockN, kHeadDim, kBlockM, wmma::col_major, wmma::row_major, true>(
            ds_s, L::kLdP, q_s, L::kLdT, dk_s, L::kLdO);
        __syncthreads();
      }
    }
  }

  T* dk = static_cast<T*>(p.dk) + c0 * ldk + g * kHeadDim;
  T* dv = static_cast<T*>(p.dv) + c0 * ldk + g * kHeadDim;
  for (int idx = threadIdx.x; idx < keys * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim;
    const int c = idx % kHeadDim;
    dk[r * ldk + c] = FromFloat<T>(dk_s[r * L::kLdO + c] * p.scale);
    dv[r * ldk + c] = FromFloat<T>(dv_s[r * L::kLdO + c]);
  }
}

// ---------------------------------------------------------------------------
// dQ
// ---------------------------------------------------------------------------

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
struct QueryLayout {
  static constexpr int kLdT = kHeadDim + kPadHalf;
  static constexpr int kLdS = kBlockN + kPadFloat;
  static constexpr int kLdP = 2 * kLdS;
  static constexpr int kLdO = kHeadDim + kPadFloat;
  static constexpr int kQ = 0;                                                   // (kBlockM, kLdT)
  static constexpr int kDo = AlignUp(kQ + kBlockM * kLdT * sizeof(T));           // (kBlockM, kLdT)
  static constexpr int kK = AlignUp(kDo + kBlockM * kLdT * sizeof(T));           // (kBlockN, kLdT)
  static constexpr int kV = AlignUp(kK + kBlockN * kLdT * sizeof(T));            // (kBlockN, kLdT)
  static constexpr int kS = AlignUp(kV + kBlockN * kLdT * sizeof(T));            // (kBlockM, kLdS)
  static constexpr int kDp = AlignUp(kS + kBlockM * kLdS * sizeof(float));       // (kBlockM, kLdS)
  static constexpr int kDq = AlignUp(kDp + kBlockM * kLdS * sizeof(float));      // (kBlockM, kLdO)
  static constexpr int kRanges = AlignUp(kDq + kBlockM * kLdO * sizeof(float));  // (kBlockM, 4)
  static constexpr int kLse = AlignUp(kRanges + kBlockM * 4 * sizeof(int64_t));  // (kBlockM)
  static constexpr int kDelta = AlignUp(kLse + kBlockM * sizeof(float));         // (kBlockM)
  static constexpr int kBytes = AlignUp(kDelta + kBlockM * sizeof(float));
  static_assert(kBytes <= kMaxSmemSm80, "dQ tiles must fit sm_80 shared memory");
  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(kBlockM % 16 == 0 && kBlockN % 32 == 0, "rows in wmma tiles, columns per lane");
  static_assert(kBlockM <= kThreads, "one thread per row tests a key tile");
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads) AttentionQueryGradKernel(const BackwardParams p) {
  using L = QueryLayout<T, kHeadDim, kBlockM, kBlockN>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);            // (kBlockM, kHeadDim)
  T* do_s = reinterpret_cast<T*>(smem + L::kDo);          // (kBlockM, kHeadDim)
  T* k_s = reinterpret_cast<T*>(smem + L::kK);            // (kBlockN, kHeadDim)
  T* v_s = reinterpret_cast<T*>(smem + L::kV);            // (kBlockN, kHeadDim)
  float* s_s = reinterpret_cast<float*>(smem + L::kS);    // (kBlockM, kBlockN) S
  T* ds_s = reinterpret_cast<T*>(smem + L::kS);           // (kBlockM, kBlockN) dS over S
  float* dp_s = reinterpret_cast<float*>(smem + L::kDp);  // (kBlockM, kBlockN) dP
  float* dq_s = reinterpret_cast<float*>(smem + L::kDq);  // (kBlockM, kHeadDim)
  int64_t* ranges_s = reinterpret_cast<int64_t*>(smem + L::kRanges);  // (kBlockM, 4)
  float* lse2_s = reinterpret_cast<float*>(smem + L::kLse);           // (kBlockM)
  float* delta_s = reinterpret_cast<float*>(smem + L::kDelta);        // (kBlockM)

  const TileItem item = p.items[blockIdx.x];
  const int64_t h = blockIdx.y;
  const int64_t g = h / (p.num_heads / p.num_kv_heads);
  const int64_t ldq = p.num_heads * kHeadDim;
  const int64_t ldk = p.num_kv_heads * kHeadDim;
  const int64_t r0 = item.begin;
  const int rows = static_cast<int>(item.end - item.begin);

  LoadTileAsync<T, kBlockM, kHeadDim>(
      q_s, L::kLdT, static_cast<const T*>(p.q) + r0 * ldq + h * kHeadDim, ldq, rows);
  LoadTileAsync<T, kBlockM, kHeadDim>(
      do_s, L::kLdT, static_cast<const T*>(p.dout) + r0 * ldq + h * kHeadDim, ldq, rows);
  LoadRanges<kBlockM>(ranges_s, p.key_ranges, r0, rows);
  LoadRowStats<kBlockM>(lse2_s, delta_s, p, h, r0, rows);
  for (int idx = threadIdx.x; idx < kBlockM * L::kLdO; idx += kThreads) dq_s[idx] = 0.0f;
  CpAsyncWaitAll();
  __syncthreads();

  for (int64_t sp = 0; sp < item.span_count; ++sp) {
    for (int64_t c0 = item.span_begin[sp]; c0 < item.span_end[sp]; c0 += kBlockN) {
      const int64_t c1 = min(c0 + kBlockN, item.span_end[sp]);
      const int valid_cols = static_cast<int>(c1 - c0);
      const bool meets = threadIdx.x < kBlockM && Meets(ranges_s + 4 * threadIdx.x, c0, c1);
      if (!__syncthreads_or(meets)) continue;

      LoadTileAsync<T, kBlockN, kHeadDim>(
          k_s, L::kLdT, static_cast<const T*>(p.k) + c0 * ldk + g * kHeadDim, ldk, valid_cols);
      LoadTileAsync<T, kBlockN, kHeadDim>(
          v_s, L::kLdT, static_cast<const T*>(p.v) + c0 * ldk + g * kHeadDim, ldk, valid_cols);
      CpAsyncWaitAll();
      __syncthreads();

      // s (kBlockM, kBlockN) = Q (kBlockM, D) . K^T (D, kBlockN)
      BlockGemm<T, kBlockM, kBlockN, kHeadDim, wmma::row_major, wmma::col_major, false>(
          q_s, L::kLdT, k_s, L::kLdT, s_s, L::kLdS);
      // dp (kBlockM, kBlockN) = dO (kBlockM, D) . V^T (D, kBlockN)
      BlockGemm<T, kBlockM, kBlockN, kHeadDim, wmma::row_major, wmma::col_major, false>(
          do_s, L::kLdT, v_s, L::kLdT, dp_s, L::kLdS);
      __syncthreads();

      SoftmaxGradTile<T, kBlockM, kBlockN>(s_s, dp_s, L::kLdS, ds_s, nullptr, ranges_s, lse2_s,
                                           delta_s, c0, valid_cols, p.scale_log2);
      __syncthreads();

      // dq (kBlockM, D) += dS (kBlockM, kBlockN) . K (kBlockN, D); scaled at the end
      BlockGemm<T, kBlockM, kHeadDim, kBlockN, wmma::row_major, wmma::row_major, true>(
          ds_s, L::kLdP, k_s, L::kLdT, dq_s, L::kLdO);
      __syncthreads();
    }
  }

  T* dq = static_cast<T*>(p.dq) + r0 * ldq + h * kHeadDim;
  for (int idx = threadIdx.x; idx < rows * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim;
    const int c = idx % kHeadDim;
    dq[r * ldq + c] = FromFloat<T>(dq_s[r * L::kLdO + c] * p.scale);
  }
}

template <typename T, int kHeadDim>
void LaunchBackward(BackwardParams p, const IntervalMask& mask, const at::Device& device,
                    cudaStream_t stream) {
  using Tl = Tiles<kHeadDim>;
  // dK, dV: tiles of keys, spans of the queries that see them.
  const std::vector<TileItem> kv_items = MakeTileItems(mask.segments, mask.query_ranges, Tl::kKvN);
  // dQ: tiles of queries, spans of the keys they see.
  const std::vector<TileItem> q_items = MakeTileItems(mask.segments, mask.key_ranges, Tl::kDqM);
  if (kv_items.empty()) return;
  const at::Tensor kv_dev = ItemsToDevice(kv_items, device);
  const at::Tensor q_dev = ItemsToDevice(q_items, device);

  constexpr int kKvBytes = KeyValueLayout<T, kHeadDim, Tl::kKvN, Tl::kKvM>::kBytes;
  auto* kv_kernel = AttentionKeyValueGradKernel<T, kHeadDim, Tl::kKvN, Tl::kKvM>;
  PrepareSmem(kv_kernel, kKvBytes, "backward dK/dV");
  p.items = reinterpret_cast<const TileItem*>(kv_dev.const_data_ptr());
  kv_kernel<<<dim3(static_cast<unsigned>(kv_items.size()), static_cast<unsigned>(p.num_kv_heads)),
              kThreads, kKvBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  constexpr int kQBytes = QueryLayout<T, kHeadDim, Tl::kDqM, Tl::kDqN>::kBytes;
  auto* q_kernel = AttentionQueryGradKernel<T, kHeadDim, Tl::kDqM, Tl::kDqN>;
  PrepareSmem(q_kernel, kQBytes, "backward dQ");
  p.items = reinterpret_cast<const TileItem*>(q_dev.const_data_ptr());
  q_kernel<<<dim3(static_cast<unsigned>(q_items.size()), static_cast<unsigned>(p.num_heads)),
             kThreads, kQBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace attention_cuda

AttentionCudaGrads attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q_in,
                                           const at::Tensor& k_in, const at::Tensor& v_in,
                                           const at::Tensor& out_in, const at::Tensor& lse_in,
                                           const IntervalMask& mask, double scale) {
  using namespace attention_cuda;
  CheckSupported(q_in);
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = Aligned(q_in);
  const at::Tensor k = Aligned(k_in);
  const at::Tensor v = Aligned(v_in);
  const at::Tensor out = Aligned(out_in.to(q.scalar_type()));
  const at::Tensor dout = Aligned(grad_out.to(q.scalar_type()));
  const at::Tensor lse = lse_in.to(at::kFloat).contiguous();
  const int64_t num_tokens = q.size(0);
  const int64_t num_heads = q.size(1);
  const int64_t head_dim = q.size(2);
  // Every token lies in one tile of each pass, so every element is written.
  at::Tensor dq = at::empty_like(q);
  at::Tensor dk = at::empty_like(k);
  at::Tensor dv = at::empty_like(v);
  if (num_tokens == 0) return {dq, dk, dv};
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  at::Tensor delta = at::empty({num_heads, num_tokens}, q.options().dtype(at::kFloat));  // (Hq, T)
  const int64_t delta_blocks = (num_tokens * num_heads + kWarps - 1) / kWarps;
  TORCH_CHECK(delta_blocks <= std::numeric_limits<int32_t>::max(),
              "attention: T * Hq too large for the CUDA backward, got ", num_tokens * num_heads);
  DispatchHeadDimAndType(q.scalar_type(), head_dim, [&](auto type_tag, auto dim_tag) {
    using T = decltype(type_tag);
    constexpr int kHeadDim = decltype(dim_tag)::value;
    AttentionDeltaKernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(dout.const_data_ptr()), static_cast<const T*>(out.const_data_ptr()),
        delta.mutable_data_ptr<float>(), num_tokens, num_heads, kHeadDim);
    C10_CUDA_KERNEL_LAUNCH_CHECK();

    const at::Tensor key_ranges = mask.key_ranges.to(at::kLong).contiguous().to(q.device());
    BackwardParams p{q.const_data_ptr(),
                     k.const_data_ptr(),
                     v.const_data_ptr(),
                     dout.const_data_ptr(),
                     lse.const_data_ptr<float>(),
                     delta.const_data_ptr<float>(),
                     dq.mutable_data_ptr(),
                     dk.mutable_data_ptr(),
                     dv.mutable_data_ptr(),
                     key_ranges.const_data_ptr<int64_t>(),
                     nullptr,
                     num_tokens,
                     num_heads,
                     k.size(1),
                     static_cast<float>(scale),
                     static_cast<float>(scale) * kLog2e};
    LaunchBackward<T, kHeadDim>(p, mask, q.device(), stream);
  });
  return {dq, dk, dv};
}

}  // namespace ballast::kernels
