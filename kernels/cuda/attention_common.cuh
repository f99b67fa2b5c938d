// Shared pieces of the CUDA attention kernels (attention_fwd.cu,
// attention_bwd.cu): launch dispatch over the compiled tile variants, the
// shared-memory buffers (layout from kernels/attention_tiles.h), cp.async tile
// loads, the tensor-core block product, the interval mask tests, the walk
// over a query tile's visible key tiles and the store of fp32 accumulators.
// Internal to kernels/cuda.
//
// Every matrix product runs on tensor cores through nvcuda::wmma (bf16 / fp16
// m16n16k16 with fp32 accumulators, sm_80+), from operands in shared memory
// into fp32 results in shared memory. Keeping the accumulators in shared
// memory rather than in opaque fragments is what lets the softmax rescale and
// mask rows element by element; it costs shared-memory bandwidth, not
// correctness.
#ifndef BALLAST_KERNELS_CUDA_ATTENTION_COMMON_CUH_
#define BALLAST_KERNELS_CUDA_ATTENTION_COMMON_CUH_

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention_plan.h"
#include "kernels/attention_tiles.h"
#include "kernels/cpu/attention_cpu.h"

// bf16 wmma fragments and cp.async exist from sm_80 on; an older target would
// fail later with obscure "incomplete type" errors.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda attention needs sm_80 or newer: set BALLAST_CUDA_ARCHITECTURES to 80 or above"
#endif

namespace ballast::kernels::attention_cuda {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Blocks per SM the tile kernels are built for (__launch_bounds__): their
// shared memory lets at most two share an SM, so a thread may use 128
// registers. Left to itself, ptxas 13.0 held these kernels at 64 and spilled
// 8 to 24 bytes in the head-dim-256 and dK/dV variants; at 128 none spills.
constexpr int kMinBlocksPerSm = 2;
// log2(e): the kernels exponentiate with exp2f on scores pre-multiplied by it.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Score columns each lane of a warp owns in a row of `cols` columns; tiles
// narrower than a warp leave the upper lanes idle.
constexpr int LaneCols(int cols) { return (cols + 31) / 32; }

// A compiled tile shape as a type, for the launch templates.
template <int kRows, int kCols>
struct Tile {
  static constexpr int rows = kRows;
  static constexpr int cols = kCols;
};

constexpr PassVariants VariantsOf(AttentionPass pass, int head_dim) {
  const TileVariants v = TileVariantsFor(head_dim);
  return pass == AttentionPass::kForward ? v.fwd : pass == AttentionPass::kQueryGrad ? v.dq : v.dkv;
}

// What every pass reads: q, k, v, the mask's key intervals and its tiles.
struct CommonParams {
  const void* q;              // (T, Hq, D)
  const void* k;              // (T, Hkv, D)
  const void* v;              // (T, Hkv, D)
  const int64_t* key_ranges;  // (T, 4)
  const TileItem* items;      // (gridDim.x)
  int64_t num_tokens;
  int64_t num_heads;
  int64_t num_kv_heads;
  float scale_log2;  // scale * log2(e)
};

// The common parameters of aligned q (T, Hq, D), k and v (T, Hkv, D).
inline CommonParams MakeCommonParams(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& key_ranges, const at::Tensor& items,
                                     double scale) {
  return {q.const_data_ptr(),
          k.const_data_ptr(),
          v.const_data_ptr(),
          key_ranges.const_data_ptr<int64_t>(),
          reinterpret_cast<const TileItem*>(items.const_data_ptr()),
          q.size(0),
          q.size(1),
          k.size(1),
          static_cast<float>(scale) * kLog2e};
}

// The layout of a compiled variant, with the static checks it must pass.
template <AttentionPass kPass, int kHeadDim, int kRowsQ, int kRowsK>
__host__ __device__ constexpr SmemLayout CheckedLayout() {
  static_assert(kRowsQ % 16 == 0 && kRowsK % 16 == 0 && kHeadDim % 16 == 0,
                "wmma works on 16 x 16 x 16 fragments");
  static_assert(kRowsQ <= kThreads, "one thread per query row tests a tile");
  static_assert(MakeSmemLayout(kPass, kHeadDim, kRowsQ, kRowsK).bytes <= 227 * 1024,
                "no CUDA device allows more shared memory per block");
  return MakeSmemLayout(kPass, kHeadDim, kRowsQ, kRowsK);
}

// Opts `kernel` in to `bytes` of dynamic shared memory after checking the
// device allows it (choose_attention_kernel picked tiles that fit, so this
// fails only when a caller forces a variant).
template <typename Kernel>
void PrepareSmem(Kernel kernel, int bytes, const char* name) {
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major >= 8, "attention: the CUDA kernels need sm_80 or newer, device is sm_",
              prop->major, prop->minor);
  TORCH_CHECK(static_cast<size_t>(bytes) <= prop->sharedMemPerBlockOptin, "attention: ", name,
              " needs ", bytes, " bytes of shared memory per block, the device allows ",
              prop->sharedMemPerBlockOptin);
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// t contiguous and 16-byte aligned, as cp.async needs; a view that starts
// off alignment is copied.
inline at::Tensor Aligned(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 == 0 ? c : c.clone();
}

// q, k and v as the kernels read them, each through Aligned.
struct AlignedQkv {
  at::Tensor q, k, v;
};
inline AlignedQkv AlignQkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {Aligned(q), Aligned(k), Aligned(v)};
}

// Calls fn(T{}, std::integral_constant<int, D>{}, Tile<rows, cols>{}) for the
// element type (__nv_bfloat16 or __half), the head dim (64, 128, 256) and
// `tile`, which must be one of the pass's compiled variants.
template <AttentionPass kPass, typename Fn>
void DispatchKernel(at::ScalarType dtype, int64_t head_dim, TileShape tile, Fn&& fn) {
  auto by_tile = [&](auto type_tag, auto dim_tag) {
    constexpr int kD = decltype(dim_tag)::value;
    constexpr TileShape kLarge = VariantsOf(kPass, kD).large;
    constexpr TileShape kSmall = VariantsOf(kPass, kD).small;
    if (tile == kLarge) {
      fn(type_tag, dim_tag, Tile<kLarge.rows, kLarge.cols>{});
    } else {
      TORCH_CHECK(tile == kSmall, "attention: no compiled tile ", tile.rows, "x", tile.cols,
                  " for head dim ", kD);
      fn(type_tag, dim_tag, Tile<kSmall.rows, kSmall.cols>{});
    }
  };
  auto by_dim = [&](auto type_tag) {
    switch (head_dim) {
      case 64:
        by_tile(type_tag, std::integral_constant<int, 64>{});
        break;
      case 128:
        by_tile(type_tag, std::integral_constant<int, 128>{});
        break;
      default:
        by_tile(type_tag, std::integral_constant<int, 256>{});
        break;
    }
  };
  if (dtype == at::kBFloat16) {
    by_dim(__nv_bfloat16{});
  } else {
    by_dim(__half{});
  }
}

// ---------------------------------------------------------------------------
// Device helpers
// ---------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half(x);
}

__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
}

// Waits for this thread's cp.async copies; a __syncthreads must follow before
// other threads read them.
__device__ __forceinline__ void CpAsyncWaitAll() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}

// smem (kRows, kHeadDim) with row stride ld <- rows [0, valid) of a (T, H, D)
// tensor, starting at `gmem` (row 0 of the tile, its head) with row stride
// `row_stride` elements; rows >= valid are zero, so that padded rows add 0
// to every product (a garbage NaN times a zero probability would be NaN).
template <typename T, int kRows, int kHeadDim>
__device__ __forceinline__ void LoadTileAsync(T* smem, int ld, const T* gmem, int64_t row_stride,
                                              int valid) {
  constexpr int kPerChunk = 16 / sizeof(T);
  constexpr int kChunksPerRow = kHeadDim / kPerChunk;
  static_assert(kHeadDim % kPerChunk == 0, "rows are copied in 16-byte chunks");
  for (int idx = threadIdx.x; idx < kRows * kChunksPerRow; idx += kThreads) {
    const int r = idx / kChunksPerRow;
    const int c = (idx % kChunksPerRow) * kPerChunk;
    T* dst = smem + r * ld + c;
    if (r < valid) {
      CpAsync16(dst, gmem + static_cast<int64_t>(r) * row_stride + c);
    } else {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
    }
  }
}

// C (kM, kN) fp32 = [C +] A (kM, kK) . B (kK, kN) on tensor cores, all in
// shared memory. Element (i, k) of A is a[i * lda + k] for row_major and
// a[k * lda + i] for col_major; element (k, j) of B is b[k * ldb + j] for
// row_major and b[j * ldb + k] for col_major. Each warp owns whole 16 x 16
// output fragments, so the caller syncs only before reading C.
template <typename T, int kM, int kN, int kK, typename LayoutA, typename LayoutB, bool kAccumulate>
__device__ __forceinline__ void BlockGemm(const T* a, int lda, const T* b, int ldb, float* c,
                                          int ldc) {
  namespace wmma = nvcuda::wmma;
  static_assert(kM % 16 == 0 && kN % 16 == 0 && kK % 16 == 0, "wmma works on 16 x 16 x 16");
  constexpr bool kRowA = std::is_same_v<LayoutA, wmma::row_major>;
  constexpr bool kRowB = std::is_same_v<LayoutB, wmma::row_major>;
  constexpr int kTilesN = kN / 16;
  const int warp = threadIdx.x / 32;
  for (int f = warp; f < (kM / 16) * kTilesN; f += kWarps) {
    const int i0 = (f / kTilesN) * 16;
    const int j0 = (f % kTilesN) * 16;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    if constexpr (kAccumulate) {
      wmma::load_matrix_sync(acc, c + i0 * ldc + j0, ldc, wmma::mem_row_major);
    } else {
      wmma::fill_fragment(acc, 0.0f);
    }
#pragma unroll 4
    for (int k0 = 0; k0 < kK; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LayoutA> fa;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LayoutB> fb;
      wmma::load_matrix_sync(fa, kRowA ? a + i0 * lda + k0 : a + k0 * lda + i0, lda);
      wmma::load_matrix_sync(fb, kRowB ? b + k0 * ldb + j0 : b + j0 * ldb + k0, ldb);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + i0 * ldc + j0, acc, ldc, wmma::mem_row_major);
  }
}

// Whether key column j lies in a row's intervals {lo0, hi0, lo1, hi1}.
__device__ __forceinline__ bool Sees(const int64_t* r, int64_t j) {
  return (r[0] <= j && j < r[1]) || (r[2] <= j && j < r[3]);
}

// Whether a row's intervals meet the columns [c0, c1).
__device__ __forceinline__ bool Meets(const int64_t* r, int64_t c0, int64_t c1) {
  return (max(r[0], c0) < min(r[1], c1)) || (max(r[2], c0) < min(r[3], c1));
}

// Loads the (rows, 4) intervals of rows [0, valid) from `ranges` + 4 * row0;
// rows past valid get empty intervals, so they see nothing.
template <int kRows>
__device__ __forceinline__ void LoadRanges(int64_t* smem, const int64_t* ranges, int64_t row0,
                                           int valid) {
  for (int idx = threadIdx.x; idx < kRows * 4; idx += kThreads) {
    smem[idx] = idx / 4 < valid ? ranges[4 * row0 + idx] : 0;
  }
}

// The shared-memory buffers of a pass (see SmemLayout); P and dS, in the
// input dtype, overlay the fp32 S and dP rows they are computed from.
template <typename T>
struct SmemBuffers {
  T* q;             // (rows_q, ld_t)
  T* dout;          // (rows_q, ld_t)
  T* k;             // (rows_k, ld_t)
  T* v;             // (rows_k, ld_t)
  float* s;         // (rows_q, ld_s)
  T* s_half;        // (rows_q, 2 * ld_s) over s
  float* dp;        // (rows_q, ld_s)
  T* dp_half;       // (rows_q, 2 * ld_s) over dp
  float* acc_q;     // (rows_q, ld_o)
  float* acc_k;     // (rows_k, ld_o)
  float* acc_v;     // (rows_k, ld_o)
  int64_t* ranges;  // (rows_q, 4)
  float* stat0;     // (rows_q)
  float* stat1;     // (rows_q)
};

template <typename T>
__device__ __forceinline__ SmemBuffers<T> Carve(unsigned char* smem, const SmemLayout& l) {
  return {reinterpret_cast<T*>(smem + l.q),         reinterpret_cast<T*>(smem + l.dout),
          reinterpret_cast<T*>(smem + l.k),         reinterpret_cast<T*>(smem + l.v),
          reinterpret_cast<float*>(smem + l.s),     reinterpret_cast<T*>(smem + l.s),
          reinterpret_cast<float*>(smem + l.dp),    reinterpret_cast<T*>(smem + l.dp),
          reinterpret_cast<float*>(smem + l.acc_q), reinterpret_cast<float*>(smem + l.acc_k),
          reinterpret_cast<float*>(smem + l.acc_v), reinterpret_cast<int64_t*>(smem + l.ranges),
          reinterpret_cast<float*>(smem + l.stat0), reinterpret_cast<float*>(smem + l.stat1)};
}

// Span sp (0 or 1) of a tile. Selected, not indexed: a runtime index into the
// item's arrays would put the whole item in local memory (a 56-byte stack
// frame in every attention kernel).
__device__ __forceinline__ int64_t SpanBegin(const TileItem& item, int sp) {
  return sp == 0 ? item.span_begin[0] : item.span_begin[1];
}
__device__ __forceinline__ int64_t SpanEnd(const TileItem& item, int sp) {
  return sp == 0 ? item.span_end[0] : item.span_end[1];
}

// A (query tile, query head) block of the forward or the dQ pass:
// blockIdx.x picks the tile, blockIdx.y the head, whose kv head is g.
struct QueryTileBlock {
  TileItem item;
  int64_t h;    // query head
  int64_t g;    // its kv head
  int64_t ldq;  // row stride of q-shaped tensors, Hq * D
  int64_t ldk;  // row stride of k-shaped tensors, Hkv * D
  int64_t r0;   // first query row
  int rows;     // query rows in the tile
};

__device__ __forceinline__ QueryTileBlock LocateQueryTile(const CommonParams& p, int head_dim) {
  const TileItem item = p.items[blockIdx.x];
  const int64_t h = blockIdx.y;
  return {item,
          h,
          h / (p.num_heads / p.num_kv_heads),
          p.num_heads * head_dim,
          p.num_kv_heads * head_dim,
          item.begin,
          static_cast<int>(item.end - item.begin)};
}

// Walks the key tiles of kRowsK rows inside a query tile's spans, skipping
// those that no query row (intervals in ranges_s, one row per thread below
// kRowsQ) sees, and calls body(c0, valid_cols) once K and V rows
// [c0, c0 + valid_cols) of kv head `g` are in k_s and v_s. Columns past
// valid_cols are zero rows, not keys. Every thread must call it.
template <typename T, int kRowsQ, int kRowsK, int kHeadDim, typename Body>
__device__ __forceinline__ void ForEachVisibleKeyTile(const TileItem& item, const int64_t* ranges_s,
                                                      T* k_s, T* v_s, int ld, const T* k_head,
                                                      const T* v_head, int64_t ldk, Body&& body) {
  for (int sp = 0; sp < item.span_count; ++sp) {
    const int64_t span_end = SpanEnd(item, sp);
    for (int64_t c0 = SpanBegin(item, sp); c0 < span_end; c0 += kRowsK) {
      const int64_t c1 = min(c0 + kRowsK, span_end);
      const int valid_cols = static_cast<int>(c1 - c0);
      const bool meets = threadIdx.x < kRowsQ && Meets(ranges_s + 4 * threadIdx.x, c0, c1);
      // A tile that no row of this tile sees costs nothing.
      if (!__syncthreads_or(meets)) continue;
      LoadTileAsync<T, kRowsK, kHeadDim>(k_s, ld, k_head + c0 * ldk, ldk, valid_cols);
      LoadTileAsync<T, kRowsK, kHeadDim>(v_s, ld, v_head + c0 * ldk, ldk, valid_cols);
      CpAsyncWaitAll();
      __syncthreads();
      body(c0, valid_cols);
    }
  }
}

// dst rows [0, rows) (row stride ld_dst) = scale * src (fp32, row stride
// ld_src), rounded once to T.
template <typename T, int kHeadDim>
__device__ __forceinline__ void StoreRows(T* dst, int64_t ld_dst, const float* src, int ld_src,
                                          int rows, float scale) {
  for (int idx = threadIdx.x; idx < rows * kHeadDim; idx += kThreads) {
    const int r = idx / kHeadDim;
    const int c = idx % kHeadDim;
    dst[r * ld_dst + c] = FromFloat<T>(src[r * ld_src + c] * scale);
  }
}

}  // namespace ballast::kernels::attention_cuda

#endif  // BALLAST_KERNELS_CUDA_ATTENTION_COMMON_CUH_
