// Attention forward on CUDA: FlashAttention-2 over an IntervalMask.
//
// Inputs: q (T, Hq, D), k and v (T, Hkv, D), bf16 or fp16, contiguous; query
// head h reads kv head h / (Hq / Hkv). key_ranges (T, 4) int64: query i sees
// keys [lo0, hi0) U [lo1, hi1) (interval_mask(), shared with the CPU kernel).
// For each head and row i, with V(i) the keys it sees:
//   s_ij  = scale * q_i . k_j                       j in V(i)
//   lse_i = log sum_{j in V(i)} exp(s_ij)           (Hq, T) fp32, kept for the backward
//   out_i = sum_{j in V(i)} exp(s_ij - lse_i) v_j   (T, Hq, D) in q's dtype
// A row with V(i) empty gets out_i = 0 and lse_i = -inf, never NaN.
//
// One block per (query tile of kBlockM rows, query head). It visits only the
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

#include <cmath>
#include <limits>

#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_cuda.h"

namespace ballast::kernels {
namespace attention_cuda {
namespace {

namespace wmma = nvcuda::wmma;

struct ForwardParams {
  const void* q;              // (T, Hq, D)
  const void* k;              // (T, Hkv, D)
  const void* v;              // (T, Hkv, D)
  void* out;                  // (T, Hq, D)
  float* lse;                 // (Hq, T)
  const int64_t* key_ranges;  // (T, 4)
  const TileItem* items;      // (gridDim.x)
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  float scale_log2;  // scale * log2(e)
};

// Shared memory of the forward block, in bytes from the start.
template <typename T, int kHeadDim, int kBlockM, int kBlockN>
struct ForwardLayout {
  static constexpr int kLdT = kHeadDim + kPadHalf;  // Q, K, V rows
  static constexpr int kLdS = kBlockN + kPadFloat;  // scores (fp32)
  static constexpr int kLdP = 2 * kLdS;             // probabilities (T), over the scores
  static constexpr int kLdO = kHeadDim + kPadFloat;
  static constexpr int kQ = 0;                                                   // (kBlockM, kLdT)
  static constexpr int kK = AlignUp(kQ + kBlockM * kLdT * sizeof(T));            // (kBlockN, kLdT)
  static constexpr int kV = AlignUp(kK + kBlockN * kLdT * sizeof(T));            // (kBlockN, kLdT)
  static constexpr int kS = AlignUp(kV + kBlockN * kLdT * sizeof(T));            // (kBlockM, kLdS)
  static constexpr int kO = AlignUp(kS + kBlockM * kLdS * sizeof(float));        // (kBlockM, kLdO)
  static constexpr int kRanges = AlignUp(kO + kBlockM * kLdO * sizeof(float));   // (kBlockM, 4)
  static constexpr int kMax = AlignUp(kRanges + kBlockM * 4 * sizeof(int64_t));  // (kBlockM)
  static constexpr int kSum = AlignUp(kMax + kBlockM * sizeof(float));           // (kBlockM)
  static constexpr int kBytes = AlignUp(kSum + kBlockM * sizeof(float));
  static_assert(kBytes <= kMaxSmemSm80, "forward tiles must fit sm_80 shared memory");
  static_assert(sizeof(T) == 2, "tensor-core operands are bf16 or fp16");
  static_assert(kBlockM % 16 == 0 && kBlockN % 32 == 0, "rows in wmma tiles, columns per lane");
  static_assert(kBlockM <= kThreads, "one thread per row tests a key tile");
};

template <typename T, int kHeadDim, int kBlockM, int kBlockN>
__global__ void __launch_bounds__(kThreads) AttentionForwardKernel(const ForwardParams p) {
  using L = ForwardLayout<T, kHeadDim, kBlockM, kBlockN>;
  constexpr int kCols = kBlockN / 32;  // score columns per lane
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  extern __shared__ __align__(128) unsigned char smem[];
  T* q_s = reinterpret_cast<T*>(smem + L::kQ);          // (kBlockM, kHeadDim)
  T* k_s = reinterpret_cast<T*>(smem + L::kK);          // (kBlockN, kHeadDim)
  T* v_s = reinterpret_cast<T*>(smem + L::kV);          // (kBlockN, kHeadDim)
  float* s_s = reinterpret_cast<float*>(smem + L::kS);  // (kBlockM, kBlockN)
  T* p_s = reinterpret_cast<T*>(smem + L::kS);          // (kBlockM, kBlockN), row r over s row r
  float* o_s = reinterpret_cast<float*>(smem + L::kO);  // (kBlockM, kHeadDim)
  int64_t* ranges_s = reinterpret_cast<int64_t*>(smem + L::kRanges);  // (kBlockM, 4)
  float* m_s = reinterpret_cast<float*>(smem + L::kMax);              // (kBlockM), log2 domain
  float* l_s = reinterpret_cast<float*>(smem + L::kSum);              // (kBlockM)

  const TileItem item = p.items[blockIdx.x];
  const int64_t h = blockIdx.y;
  const int64_t g = h / (p.num_heads / p.num_kv_heads);
  const int64_t ldq = p.num_heads * kHeadDim;
  const int64_t ldk = p.num_kv_heads * kHeadDim;
  const int64_t r0 = item.begin;
  const int rows = static_cast<int>(item.end - item.begin);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;

  LoadTileAsync<T, kBlockM, kHeadDim>(
      q_s, L::kLdT, static_cast<const T*>(p.q) + r0 * ldq + h * kHeadDim, ldq, rows);
  LoadRanges<kBlockM>(ranges_s, p.key_ranges, r0, rows);
  for (int idx = threadIdx.x; idx < kBlockM * L::kLdO; idx += kThreads) o_s[idx] = 0.0f;
  for (int r = threadIdx.x; r < kBlockM; r += kThreads) {
    m_s[r] = kNegInf;
    l_s[r] = 0.0f;
  }
  CpAsyncWaitAll();
  __syncthreads();

  for (int64_t sp = 0; sp < item.span_count; ++sp) {
    for (int64_t c0 = item.span_begin[sp]; c0 < item.span_end[sp]; c0 += kBlockN) {
      const int64_t c1 = min(c0 + kBlockN, item.span_end[sp]);
      const int valid_cols = static_cast<int>(c1 - c0);
      const bool meets = threadIdx.x < kBlockM && Meets(ranges_s + 4 * threadIdx.x, c0, c1);
      // A tile that no row of this tile sees costs nothing.
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
      __syncthreads();

      for (int r = warp; r < kBlockM; r += kWarps) {
        const int64_t* rr = ranges_s + 4 * r;
        float x[kCols];
        float row_max = kNegInf;
#pragma unroll
        for (int t = 0; t < kCols; ++t) {
          const int jj = lane + 32 * t;
          // Columns past the span's end are not this tile's: another span
          // (or nobody) owns them, so they are masked like invisible keys.
          x[t] =
              jj < valid_cols && Sees(rr, c0 + jj) ? s_s[r * L::kLdS + jj] * p.scale_log2 : kNegInf;
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
        for (int t = 0; t < kCols; ++t) p_s[r * L::kLdP + lane + 32 * t] = FromFloat<T>(x[t]);
        for (int c = lane; c < kHeadDim; c += 32) o_s[r * L::kLdO + c] *= rescale;
        if (lane == 0) {
          m_s[r] = m_new;
          l_s[r] = l_s[r] * rescale + sum;
        }
      }
      __syncthreads();

      // o (kBlockM, D) += P (kBlockM, kBlockN) . V (kBlockN, D)
      BlockGemm<T, kBlockM, kHeadDim, kBlockN, wmma::row_major, wmma::row_major, true>(
          p_s, L::kLdP, v_s, L::kLdT, o_s, L::kLdO);
      __syncthreads();
    }
  }

  T* out = static_cast<T*>(p.out);
  for (int r = warp; r < rows; r += kWarps) {
    // l == 0 only for a row that saw no key: output 0, lse -inf. A NaN l
    // propagates.
    const float l = l_s[r];
    const bool empty = l == 0.0f;
    const float inv = empty ? 0.0f : 1.0f / l;
    T* dst = out + (r0 + r) * ldq + h * kHeadDim;
    for (int c = lane; c < kHeadDim; c += 32) dst[c] = FromFloat<T>(o_s[r * L::kLdO + c] * inv);
    if (lane == 0) {
      p.lse[h * p.num_tokens + r0 + r] = empty ? kNegInf : (m_s[r] + log2f(l)) * kLn2;
    }
  }
}

template <typename T, int kHeadDim>
void LaunchForward(const ForwardParams& p, int64_t num_items, cudaStream_t stream) {
  constexpr int kBlockM = Tiles<kHeadDim>::kFwdM;
  constexpr int kBlockN = Tiles<kHeadDim>::kFwdN;
  constexpr int kBytes = ForwardLayout<T, kHeadDim, kBlockM, kBlockN>::kBytes;
  auto* kernel = AttentionForwardKernel<T, kHeadDim, kBlockM, kBlockN>;
  PrepareSmem(kernel, kBytes, "forward");
  const dim3 grid(static_cast<unsigned>(num_items), static_cast<unsigned>(p.num_heads));
  kernel<<<grid, kThreads, kBytes, stream>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace
}  // namespace attention_cuda

using attention_cuda::DispatchHeadDimAndType;

AttentionCudaForward attention_cuda_forward(const at::Tensor& q_in, const at::Tensor& k_in,
                                            const at::Tensor& v_in, const IntervalMask& mask,
                                            double scale) {
  attention_cuda::CheckSupported(q_in);
  c10::cuda::CUDAGuard guard(q_in.device());
  const at::Tensor q = attention_cuda::Aligned(q_in);
  const at::Tensor k = attention_cuda::Aligned(k_in);
  const at::Tensor v = attention_cuda::Aligned(v_in);
  const int64_t num_tokens = q.size(0);
  const int64_t num_heads = q.size(1);
  at::Tensor out = at::empty_like(q);                                                  // (T, Hq, D)
  at::Tensor lse = at::empty({num_heads, num_tokens}, q.options().dtype(at::kFloat));  // (Hq, T)
  if (num_tokens == 0) return {out, lse};

  const int64_t head_dim = q.size(2);
  const at::Tensor key_ranges = mask.key_ranges.to(at::kLong).contiguous().to(q.device());
  DispatchHeadDimAndType(q.scalar_type(), head_dim, [&](auto type_tag, auto dim_tag) {
    using T = decltype(type_tag);
    constexpr int kHeadDim = decltype(dim_tag)::value;
    const std::vector<attention_cuda::TileItem> items = attention_cuda::MakeTileItems(
        mask.segments, mask.key_ranges, attention_cuda::Tiles<kHeadDim>::kFwdM);
    if (items.empty()) return;
    const at::Tensor items_dev = attention_cuda::ItemsToDevice(items, q.device());
    attention_cuda::ForwardParams p{
        q.const_data_ptr(),
        k.const_data_ptr(),
        v.const_data_ptr(),
        out.mutable_data_ptr(),
        lse.mutable_data_ptr<float>(),
        key_ranges.const_data_ptr<int64_t>(),
        reinterpret_cast<const attention_cuda::TileItem*>(items_dev.const_data_ptr()),
        num_tokens,
        num_heads,
        k.size(1),
        static_cast<float>(scale) * attention_cuda::kLog2e};
    attention_cuda::LaunchForward<T, kHeadDim>(p, static_cast<int64_t>(items.size()),
                                               c10::cuda::getCurrentCUDAStream());
  });
  return {out, lse};
}

}  // namespace ballast::kernels
