// Attention forward on CUDA: FlashAttention-2 over an IntervalMask.
//
// Inputs: q (T, Hq, D), k and v (T, Hkv, D), bf16 or fp16, contiguous; query
// head h reads kv head h / (Hq / Hkv). key_ranges (T, 4) int64: query i sees
// keys [lo0, hi0) U [lo1, hi1) (interval_mask(), shared with the CPU kernel),
// on the device from the batch's MaskPlan with the tile list.
// For each head and row i, with V(i) the keys it sees:
//   s_ij  = scale * q_i . k_j                       j in V(i)
//   lse_i = log sum_{j in V(i)} exp(s_ij)           (Hq, T) fp32, kept for the backward
//   out_i = sum_{j in V(i)} exp(s_ij - lse_i) v_j   (T, Hq, D) in q's dtype
// A row with V(i) empty gets out_i = 0 and lse_i = -inf, never NaN.
//
// One block per (query tile of kBlockM rows, query head); the tile shape is
// one of the compiled variants (kernels/attention_tiles.h). It visits only the
// key tiles inside its tile's spans (the hull of its rows' intervals), skips
// a tile that no row meets, and masks the rest element by element from the
// rows' intervals; no dense mask exists. Per row it keeps the running max m
// and sum l of exp(s - m) (online softmax, fp32), rescales the fp32 output
// accumulator when m grows, and divides by l at the end.
//
// Precision: Q K^T and P V run on tensor cores with bf16 / fp16 operands and
// fp32 accumulation; the scores, m, l and the output accumulator are fp32; P
// is rounded to the input dtype for P V only, as in FlashAttention-2.
// Indexing: every global offset is int64 (T * H * D passes 2^31 at long
// contexts); only offsets inside a tile are int.

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cuda.h"

namespace ballast::kernels {
namespace attention_cuda {
namespace {

namespace wmma = nvcuda::wmma;

struct ForwardParams : CommonParams {
  void* out;   // (T, Hq, D)
  float* lse;  // (Hq, T)
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    AttentionForwardKernel(const ForwardParams p) {
  constexpr SmemLayout L = CheckedLayout<AttentionPass::kForward, kHeadDim, kBlockM, kBlockN>();
  constexpr int kCols = LaneCols(kBlockN);  // score columns per lane
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemBuffers<T> sm = Carve<T>(smem, L);
  float* o_s = sm.acc_q;  // (kBlockM, kHeadDim) unnormalised output
  float* m_s = sm.stat0;  // (kBlockM) running max, log2 domain
  float* l_s = sm.stat1;  // (kBlockM) running sum of exp2(s - m)

  const QueryTileBlock b = LocateQueryTile(p, kHeadDim);
  const TileItem& item = b.item;
  const int64_t h = b.h, g = b.g, ldq = b.ldq, ldk = b.ldk, r0 = b.r0;
  const int rows = b.rows;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  LoadTileAsync<T, kBlockM, kHeadDim>(
      sm.q, L.ld_t, static_cast<const T*>(p.q) + r0 * ldq + h * kHeadDim, ldq, rows);
  LoadRanges<kBlockM>(sm.ranges, p.key_ranges, r0, rows);
  for (int idx = threadIdx.x; idx < kBlockM * L.ld_o; idx += kThreads) o_s[idx] = 0.0f;
  for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
    m_s[r] = kNegInf;
    l_s[r] = 0.0f;
  }
  CpAsyncWaitAll();
  __syncthreads();

  ForEachVisibleKeyTile<T, kBlockM, kBlockN, kHeadDim>(
      item, sm.ranges, sm.k, sm.v, L.ld_t, static_cast<const T*>(p.k) + g * kHeadDim,
      static_cast<const T*>(p.v) + g * kHeadDim, ldk, [&](int64_t c0, int valid_cols) {
        // s (kBlockM, kBlockN) = Q (kBlockM, D) . K^T (D, kBlockN)
        BlockGemm<T, kBlockM, kBlockN, kHeadDim, wmma::row_major, wmma::col_major, false>(
            sm.q, L.ld_t, sm.k, L.ld_t, sm.s, L.ld_s);
        __syncthreads();

        for (int r = warp; r < kBlockM; r += kWarps) {
          const int64_t* rr = sm.ranges + 4 * r;
          float x[kCols];
          float row_max = kNegInf;
#pragma unroll
          for (int t = 0; t < kCols; ++t) {
            const int jj = lane + 32 * t;
            // Columns past the span's end are not this tile's: another span
            // (or nobody) owns them, so they are masked like invisible keys.
            x[t] = jj < kBlockN && jj < valid_cols && Sees(rr, c0 + jj)
                       ? sm.s[r * L.ld_s + jj] * p.scale_log2
                       : kNegInf;
            row_max = fmaxf(row_max, x[t]);
          }
#pragma unroll
          for (int off = 16; off > 0; off /= 2) {
            row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, off));
          }
          const float m_old = m_s[r];
          const float m_new = fmaxf(m_old, row_max);
          // While a row has seen no key its max is -inf; shifting by 0 instead
          // avoids -inf - -inf, which is NaN, and exp2(-inf - 0) is the 0 we want.
          const float shift = m_new == kNegInf ? 0.0f : m_new;
          const float rescale = exp2f(m_old - shift);
          float sum = 0.0f;
#pragma unroll
          for (int t = 0; t < kCols; ++t) {
            x[t] = exp2f(x[t] - shift);
            sum += x[t];
          }
#pragma unroll
          for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
          // Every lane has read its scores and m_s[r] before P overwrites the row.
          __syncwarp();
#pragma unroll
          for (int t = 0; t < kCols; ++t) {
            const int jj = lane + 32 * t;
            if (jj < kBlockN) sm.s_half[r * 2 * L.ld_s + jj] = FromFloat<T>(x[t]);
          }
          for (int c = lane; c < kHeadDim; c += 32) o_s[r * L.ld_o + c] *= rescale;
          if (lane == 0) {
            m_s[r] = m_new;
            l_s[r] = l_s[r] * rescale + sum;
          }
        }
        __syncthreads();

        // o (kBlockM, D) += P (kBlockM, kBlockN) . V (kBlockN, D)
        BlockGemm<T, kBlockM, kHeadDim, kBlockN, wmma::row_major, wmma::row_major, true>(
            sm.s_half, 2 * L.ld_s, sm.v, L.ld_t, o_s, L.ld_o);
        __syncthreads();
      });

  T* out = static_cast<T*>(p.out);
  for (int r = warp; r < rows; r += kWarps) {
    // l == 0 only for a row that saw no key: output 0, lse -inf. A NaN l
    // propagates.
    const float l = l_s[r];
    const bool empty = l == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l;
    T* dst = out + (r0 + r) * ldq + h * kHeadDim;
    for (int c = lane; c < kHeadDim; c += 32) dst[c] = FromFloat<T>(o_s[r * L.ld_o + c] * inv);
    if (lane == 0) {
      p.lse[h * p.num_tokens + r0 + r] = empty ? kNegInf : (m_s[r] + log2f(l)) * kLn2;
    }
  }
}

}  // namespace
}  // namespace attention_cuda

DeviceCaps attention_device_caps(const at::Device& device) {
  const cudaDeviceProp* prop = at::cuda::getDeviceProperties(device.index());
  DeviceCaps caps{prop->major, prop->minor, static_cast<int64_t>(prop->sharedMemPerBlockOptin)};
  if (const char* limit = std::getenv("BALLAST_ATTENTION_SMEM_LIMIT")) {
    caps.smem_optin_bytes = std::min<int64_t>(caps.smem_optin_bytes, std::atoll(limit));
  }
  return caps;
}

AttentionCudaForward attention_cuda_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                            const at::Tensor& v_in, MaskPlan& plan, TileShape tile,
                                            double scale) {
  using namespace attention_cuda;
  c10::cuda::CUDAGuard guard(q_in.device());
  const AlignedQkv in = AlignQkv(q_in, k_in, v_in);
  const at::Tensor &q = in.q, &k = in.k, &v = in.v;
  const int64_t num_tokens = q.size(0);
  const int64_t num_heads = q.size(1);
  at::Tensor out = at::empty_like(q);                                                  // (T, Hq, D)
  at::Tensor lse = at::empty({num_heads, num_tokens}, q.options().dtype(at::kFloat));  // (Hq, T)
  if (num_tokens == 0) return {out, lse};

  const MaskPlan::DeviceTiles items = plan.tiles_on(q.device(), TileSide::kQueryTiles, tile.rows);
  if (items.count == 0) return {out, lse};
  const at::Tensor key_ranges = plan.key_ranges_on(q.device());
  DispatchKernel<AttentionPass::kForward>(
      q.scalar_type(), q.size(2), tile, [&](auto type_tag, auto dim_tag, auto tile_tag) {
        using T = decltype(type_tag);
        constexpr int kHeadDim = decltype(dim_tag)::value;
        constexpr int kBlockM = decltype(tile_tag)::rows;
        constexpr int kBlockN = decltype(tile_tag)::cols;
        constexpr int kBytes = SmemBytes(AttentionPass::kForward, kHeadDim, {kBlockM, kBlockN});
        const ForwardParams p{MakeCommonParams(q, k, v, key_ranges, items.items, scale),
                              out.mutable_data_ptr(), lse.mutable_data_ptr<float>()};
        auto* kernel = AttentionForwardKernel<T, kHeadDim, kBlockM, kBlockN>;
        PrepareSmem(kernel, kBytes, "forward");
        const dim3 grid(static_cast<unsigned>(items.count), static_cast<unsigned>(num_heads));
        kernel<<<grid, kThreads, kBytes, c10::cuda::getCurrentCUDAStream()>>>(p);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      });
  return {out, lse};
}

}  // namespace ballast::kernels
