// Attention backward on CUDA: FlashAttention-2 gradients over an IntervalMask.
//
// Inputs: q (T, Hq, D), k and v (T, Hkv, D), out and grad_out dO (T, Hq, D),
// bf16 or fp16; lse (Hq, T) fp32 from the forward; key_ranges (T, 4) int64
// and the tile lists (keys cut by query_ranges, queries by key_ranges) from
// the batch's MaskPlan, on the device once per batch. With P = exp(S - lse)
// recomputed tile by tile (S = scale * Q K^T on the visible keys) and
// Delta_i = dO_i . O_i:
//   dV_j = sum_i P_ij dO_i           dS_ij = P_ij (dO_i . v_j - Delta_i)
//   dK_j = scale sum_i dS_ij q_i     dQ_i  = scale sum_j dS_ij k_j
// A row with lse = -inf saw no key: its P is 0 (exp2(s - +inf), never
// exp(-inf - -inf) = NaN), so it gets gradient 0 and contributes nothing.
//
// Three launches, no atomics, so the gradients are deterministic:
//   1. Delta (Hq, T) in fp32, one warp per (token, head).
//   2. dK, dV: one block per (key tile, kv head), tiles from the compiled
//      variants (kernels/attention_tiles.h). It keeps its K and V tile
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

struct BackwardParams : CommonParams {
  const void* dout;    // (T, Hq, D)
  const float* lse;    // (Hq, T)
  const float* delta;  // (Hq, T)
  void* dq;            // (T, Hq, D)
  void* dk;            // (T, Hkv, D)
  void* dv;            // (T, Hkv, D)
  float scale;
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

// For each row of a (kRows, kCols) score tile: P = exp2(S scale_log2 - lse2)
// on the visible keys and 0 elsewhere, dS = P (dP - Delta). Writes dS (and P
// when p_out is not null) in T over the rows of s, with row stride 2 * ld_s:
// row r of the T tile lies inside row r of the fp32 tile, and each row is
// read whole before it is overwritten.
template <typename T, int kRows, int kCols>
__device__ __forceinline__ void SoftmaxGradTile(float* s, const float* dp, int ld_s, T* ds_out,
                                                T* p_out, const int64_t* ranges_s,
                                                const float* lse2_s, const float* delta_s,
                                                int64_t c0, int valid_cols, float scale_log2) {
  constexpr int kPerLane = LaneCols(kCols);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int r = warp; r < kRows; r += kWarps) {
    const int64_t* rr = ranges_s + 4 * r;
    float pv[kPerLane];
    float dsv[kPerLane];
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int jj = lane + 32 * t;
      const bool visible = jj < kCols && jj < valid_cols && Sees(rr, c0 + jj);
      pv[t] = visible ? exp2f(s[r * ld_s + jj] * scale_log2 - lse2_s[r]) : 0.0f;
      dsv[t] = visible ? pv[t] * (dp[r * ld_s + jj] - delta_s[r]) : 0.0f;
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int jj = lane + 32 * t;
      if (jj >= kCols) continue;
      ds_out[r * 2 * ld_s + jj] = FromFloat<T>(dsv[t]);
      if (p_out != nullptr) p_out[r * 2 * ld_s + jj] = FromFloat<T>(pv[t]);
    }
  }
}

// Q and dO rows [r0, r0 + rows) of query head h into sm.q and sm.dout
// (cp.async, the caller waits), with their lse and Delta.
template <typename T, int kRows, int kHeadDim>
__device__ __forceinline__ void LoadQueryTile(const SmemBuffers<T>& sm, int ld,
                                              const BackwardParams& p, int64_t h, int64_t r0,
                                              int rows) {
  const int64_t ldq = p.num_heads * kHeadDim;
  LoadTileAsync<T, kRows, kHeadDim>(sm.q, ld, static_cast<const T*>(p.q) + r0 * ldq + h * kHeadDim,
                                    ldq, rows);
  LoadTileAsync<T, kRows, kHeadDim>(
      sm.dout, ld, static_cast<const T*>(p.dout) + r0 * ldq + h * kHeadDim, ldq, rows);
  LoadRowStats<kRows>(sm.stat0, sm.stat1, p, h, r0, rows);
}

// With Q, dO, K and V tiles in shared memory: S = Q K^T and dP = dO V^T on
// tensor cores, then dS (over dP's rows) and, when with_p, P (over S's rows)
// in the input dtype, masked by the query rows' intervals. Key columns past
// valid_cols are padding and get P = dS = 0. Ends with a __syncthreads.
template <typename T, int kRowsQ, int kRowsK, int kHeadDim>
__device__ __forceinline__ void ScoreAndGradTiles(const SmemBuffers<T>& sm, const SmemLayout& l,
                                                  float scale_log2, int64_t c0, int valid_cols,
                                                  bool with_p) {
  // s (kRowsQ, kRowsK) = Q (kRowsQ, D) . K^T (D, kRowsK)
  BlockGemm<T, kRowsQ, kRowsK, kHeadDim, wmma::row_major, wmma::col_major, false>(
      sm.q, l.ld_t, sm.k, l.ld_t, sm.s, l.ld_s);
  // dp (kRowsQ, kRowsK) = dO (kRowsQ, D) . V^T (D, kRowsK)
  BlockGemm<T, kRowsQ, kRowsK, kHeadDim, wmma::row_major, wmma::col_major, false>(
      sm.dout, l.ld_t, sm.v, l.ld_t, sm.dp, l.ld_s);
  __syncthreads();
  SoftmaxGradTile<T, kRowsQ, kRowsK>(sm.s, sm.dp, l.ld_s, sm.dp_half, with_p ? sm.s_half : nullptr,
                                     sm.ranges, sm.stat0, sm.stat1, c0, valid_cols, scale_log2);
  __syncthreads();
}

// ---------------------------------------------------------------------------
// dK, dV
// ---------------------------------------------------------------------------

template <typename T, int kHeadDim, int kBlockN, int kBlockM>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    AttentionKeyValueGradKernel(const BackwardParams p) {
  // kBlockN keys (this block's own rows) by kBlockM queries per step.
  constexpr SmemLayout L =
      CheckedLayout<AttentionPass::kKeyValueGrad, kHeadDim, kBlockM, kBlockN>();
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemBuffers<T> sm = Carve<T>(smem, L);

  const TileItem item = p.items[blockIdx.x];
  const int64_t g = blockIdx.y;
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t ldk = p.num_kv_heads * kHeadDim;
  const int64_t c0 = item.begin;
  const int64_t c1 = item.end;
  const int keys = static_cast<int>(c1 - c0);

  LoadTileAsync<T, kBlockN, kHeadDim>(
      sm.k, L.ld_t, static_cast<const T*>(p.k) + c0 * ldk + g * kHeadDim, ldk, keys);
  LoadTileAsync<T, kBlockN, kHeadDim>(
      sm.v, L.ld_t, static_cast<const T*>(p.v) + c0 * ldk + g * kHeadDim, ldk, keys);
  for (int idx = threadIdx.x; idx < kBlockN * L.ld_o; idx += kThreads) {
    sm.acc_k[idx] = 0.0f;
    sm.acc_v[idx] = 0.0f;
  }
  CpAsyncWaitAll();
  __syncthreads();

  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int sp = 0; sp < item.span_count; ++sp) {
      const int64_t span_end = SpanEnd(item, sp);
      for (int64_t r0 = SpanBegin(item, sp); r0 < span_end; r0 += kBlockM) {
        const int rows = static_cast<int>(min(r0 + kBlockM, span_end) - r0);
        LoadRanges<kBlockM>(sm.ranges, p.key_ranges, r0, rows);
        __syncthreads();
        const bool meets = threadIdx.x < kBlockM && Meets(sm.ranges + 4 * threadIdx.x, c0, c1);
        if (!__syncthreads_or(meets)) continue;

        LoadQueryTile<T, kBlockM, kHeadDim>(sm, L.ld_t, p, h, r0, rows);
        CpAsyncWaitAll();
        __syncthreads();

        ScoreAndGradTiles<T, kBlockM, kBlockN, kHeadDim>(sm, L, p.scale_log2, c0, keys,
                                                         /*with_p=*/true);

        // dv (kBlockN, D) += P^T (kBlockN, kBlockM) . dO (kBlockM, D)
        BlockGemm<T, kBlockN, kHeadDim, kBlockM, wmma::col_major, wmma::row_major, true>(
            sm.s_half, 2 * L.ld_s, sm.dout, L.ld_t, sm.acc_v, L.ld_o);
        // dk (kBlockN, D) += dS^T (kBlockN, kBlockM) . Q (kBlockM, D); scaled at the end
        BlockGemm<T, kBlockN, kHeadDim, kBlockM, wmma::col_major, wmma::row_major, true>(
            sm.dp_half, 2 * L.ld_s, sm.q, L.ld_t, sm.acc_k, L.ld_o);
        __syncthreads();
      }
    }
  }

  StoreRows<T, kHeadDim>(static_cast<T*>(p.dk) + c0 * ldk + g * kHeadDim, ldk, sm.acc_k, L.ld_o,
                         keys, p.scale);
  StoreRows<T, kHeadDim>(static_cast<T*>(p.dv) + c0 * ldk + g * kHeadDim, ldk, sm.acc_v, L.ld_o,
                         keys, 1.0f);
}

// ---------------------------------------------------------------------------
// dQ
// ---------------------------------------------------------------------------

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    AttentionQueryGradKernel(const BackwardParams p) {
  constexpr SmemLayout L = CheckedLayout<AttentionPass::kQueryGrad, kHeadDim, kBlockM, kBlockN>();
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemBuffers<T> sm = Carve<T>(smem, L);

  const QueryTileBlock b = LocateQueryTile(p, kHeadDim);
  const TileItem& item = b.item;
  const int64_t h = b.h, g = b.g, ldq = b.ldq, ldk = b.ldk, r0 = b.r0;
  const int rows = b.rows;

  LoadQueryTile<T, kBlockM, kHeadDim>(sm, L.ld_t, p, h, r0, rows);
  LoadRanges<kBlockM>(sm.ranges, p.key_ranges, r0, rows);
  for (int idx = threadIdx.x; idx < kBlockM * L.ld_o; idx += kThreads) sm.acc_q[idx] = 0.0f;
  CpAsyncWaitAll();
  __syncthreads();

  ForEachVisibleKeyTile<T, kBlockM, kBlockN, kHeadDim>(
      item, sm.ranges, sm.k, sm.v, L.ld_t, static_cast<const T*>(p.k) + g * kHeadDim,
      static_cast<const T*>(p.v) + g * kHeadDim, ldk, [&](int64_t c0, int valid_cols) {
        ScoreAndGradTiles<T, kBlockM, kBlockN, kHeadDim>(sm, L, p.scale_log2, c0, valid_cols,
                                                         /*with_p=*/false);
        // dq (kBlockM, D) += dS (kBlockM, kBlockN) . K (kBlockN, D); scaled at the end
        BlockGemm<T, kBlockM, kHeadDim, kBlockN, wmma::row_major, wmma::row_major, true>(
            sm.dp_half, 2 * L.ld_s, sm.k, L.ld_t, sm.acc_q, L.ld_o);
        __syncthreads();
      });

  StoreRows<T, kHeadDim>(static_cast<T*>(p.dq) + r0 * ldq + h * kHeadDim, ldq, sm.acc_q, L.ld_o,
                         rows, p.scale);
}

// Launches one backward pass over `items` with the compiled variant `tile`.
template <AttentionPass kPass>
void LaunchPass(const BackwardParams& p, at::ScalarType dtype, int64_t head_dim, TileShape tile,
                int64_t num_items, unsigned heads, cudaStream_t stream) {
  DispatchKernel<kPass>(dtype, head_dim, tile, [&](auto type_tag, auto dim_tag, auto tile_tag) {
    using T = decltype(type_tag);
    constexpr int kHeadDim = decltype(dim_tag)::value;
    constexpr int kRows = decltype(tile_tag)::rows;
    constexpr int kCols = decltype(tile_tag)::cols;
    constexpr int kBytes = SmemBytes(kPass, kHeadDim, {kRows, kCols});
    auto launch = [&](auto* kernel, const char* name) {
      PrepareSmem(kernel, kBytes, name);
      kernel<<<dim3(static_cast<unsigned>(num_items), heads), kThreads, kBytes, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if constexpr (kPass == AttentionPass::kKeyValueGrad) {
      launch(AttentionKeyValueGradKernel<T, kHeadDim, kRows, kCols>, "backward dK/dV");
    } else {
      launch(AttentionQueryGradKernel<T, kHeadDim, kRows, kCols>, "backward dQ");
    }
  });
}

}  // namespace
}  // namespace attention_cuda

AttentionCudaGrads attention_cuda_backward(const at::Tensor& grad_out, const at::Tensor& q_in,
                                           const at::Tensor& k_in, const at::Tensor& v_in,
                                           const at::Tensor& out_in, const at::Tensor& lse_in,
                                           MaskPlan& plan, TileShape dq_tile, TileShape dkv_tile,
                                           double scale) {
  using namespace attention_cuda;
  c10::cuda::CUDAGuard guard(q_in.device());
  const AlignedQkv in = AlignQkv(q_in, k_in, v_in);
  const at::Tensor &q = in.q, &k = in.k, &v = in.v;
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
  auto launch_delta = [&](auto type_tag) {
    using T = decltype(type_tag);
    AttentionDeltaKernel<T><<<static_cast<unsigned>(delta_blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(dout.const_data_ptr()), static_cast<const T*>(out.const_data_ptr()),
        delta.mutable_data_ptr<float>(), num_tokens, num_heads, static_cast<int>(head_dim));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  if (q.scalar_type() == at::kBFloat16) {
    launch_delta(__nv_bfloat16{});
  } else {
    launch_delta(__half{});
  }

  // dK, dV: tiles of keys, spans of the queries that see them.
  const MaskPlan::DeviceTiles kv_items =
      plan.tiles_on(q.device(), TileSide::kKeyTiles, dkv_tile.rows);
  // dQ: tiles of queries, spans of the keys they see.
  const MaskPlan::DeviceTiles q_items =
      plan.tiles_on(q.device(), TileSide::kQueryTiles, dq_tile.rows);
  if (kv_items.count == 0) return {dq, dk, dv};
  const at::Tensor key_ranges = plan.key_ranges_on(q.device());
  BackwardParams p{MakeCommonParams(q, k, v, key_ranges, kv_items.items, scale),
                   dout.const_data_ptr(),
                   lse.const_data_ptr<float>(),
                   delta.const_data_ptr<float>(),
                   dq.mutable_data_ptr(),
                   dk.mutable_data_ptr(),
                   dv.mutable_data_ptr(),
                   static_cast<float>(scale)};
  LaunchPass<AttentionPass::kKeyValueGrad>(p, q.scalar_type(), head_dim, dkv_tile, kv_items.count,
                                           static_cast<unsigned>(k.size(1)), stream);
  p.items = reinterpret_cast<const TileItem*>(q_items.items.const_data_ptr());
  LaunchPass<AttentionPass::kQueryGrad>(p, q.scalar_type(), head_dim, dq_tile, q_items.count,
                                        static_cast<unsigned>(num_heads), stream);
  return {dq, dk, dv};
}

}  // namespace ballast::kernels
