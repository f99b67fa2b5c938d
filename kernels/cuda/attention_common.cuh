// Shared pieces of the CUDA attention kernels (attention_fwd.cu,
// attention_bwd.cu): tile shapes, work items, shared-memory layout, and the
// tensor-core block product. Internal to kernels/cuda.
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
#include <ATen/ops/from_blob.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_cpu.h"

// bf16 wmma fragments and cp.async exist from sm_80 on; an older target would
// fail later with obscure "incomplete type" errors.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#error "kernels/cuda attention needs sm_80 or newer: set BALLAST_CUDA_ARCHITECTURES to 80 or above"
#endif

namespace ballast::kernels::attention_cuda {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Row paddings (in elements) that shift consecutive rows by 16 bytes, so that
// the 8 rows a wmma load touches fall in different shared-memory banks.
constexpr int kPadHalf = 8;
constexpr int kPadFloat = 4;
// log2(e): the kernels exponentiate with exp2f on scores pre-multiplied by it.
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// The largest dynamic shared memory a block may opt in to on sm_80 (A100:
// 163 KiB); every tile below is sized to fit it, so one binary runs on
// sm_80, sm_90 and sm_100.
constexpr int kMaxSmemSm80 = 163 * 1024;

// Tile shapes per head dim. kBlockM query rows by kBlockN key columns. The
// head dim 256 tiles are smaller so that Q, K, V and the fp32 accumulators
// stay inside kMaxSmemSm80.
template <int kHeadDim>
struct Tiles;
template <>
struct Tiles<64> {
  static constexpr int kFwdM = 64, kFwdN = 64;  // forward
  static constexpr int kDqM = 64, kDqN = 64;    // backward, dQ pass
  static constexpr int kKvN = 64, kKvM = 64;    // backward, dK/dV pass (keys, queries)
};
template <>
struct Tiles<128> {
  static constexpr int kFwdM = 64, kFwdN = 64;
  static constexpr int kDqM = 64, kDqN = 64;
  static constexpr int kKvN = 64, kKvM = 32;
};
template <>
struct Tiles<256> {
  static constexpr int kFwdM = 64, kFwdN = 32;
  static constexpr int kDqM = 32, kDqN = 32;
  static constexpr int kKvN = 32, kKvM = 32;
};

// One tile of one segment: rows [begin, end) (queries for the forward and dQ,
// keys for dK/dV) and up to two spans of the other side that some row of the
// tile meets (the hull of its rows' intervals). Tiles outside the spans are
// never visited; a tile with no span only writes its empty-row result.
struct TileItem {
  int64_t begin;
  int64_t end;
  int64_t span_begin[2];
  int64_t span_end[2];
  int64_t span_count;
};
static_assert(sizeof(TileItem) == 7 * sizeof(int64_t), "TileItem is copied to the device as bytes");

// Cuts every segment into tiles of `block` rows and gives each the union of
// the intervals `ranges` (T, 4) lists for its rows, as at most two spans,
// most costly tiles first so that the longest causal tiles start first.
inline std::vector<TileItem> MakeTileItems(const at::Tensor& segments_cpu,
                                           const at::Tensor& ranges_cpu, int64_t block) {
  const at::Tensor seg = segments_cpu.contiguous();
  const at::Tensor rng = ranges_cpu.contiguous();
  const int64_t* s = seg.const_data_ptr<int64_t>();
  const int64_t* r = rng.const_data_ptr<int64_t>();
  std::vector<TileItem> items;
  std::vector<int64_t> cost;
  for (int64_t i = 0; i + 1 < seg.numel(); ++i) {
    for (int64_t b = s[i]; b < s[i + 1]; b += block) {
      TileItem item{b, std::min(b + block, s[i + 1]), {0, 0}, {0, 0}, 0};
      int64_t lo[2], hi[2];
      bool seen[2] = {false, false};
      for (int64_t row = item.begin; row < item.end; ++row) {
        for (int slot = 0; slot < 2; ++slot) {
          const int64_t a = r[4 * row + 2 * slot];
          const int64_t z = r[4 * row + 2 * slot + 1];
          if (a >= z) continue;
          lo[slot] = seen[slot] ? std::min(lo[slot], a) : a;
          hi[slot] = seen[slot] ? std::max(hi[slot], z) : z;
          seen[slot] = true;
        }
      }
      for (int slot = 0; slot < 2; ++slot) {
        if (!seen[slot]) continue;
        item.span_begin[item.span_count] = lo[slot];
        item.span_end[item.span_count] = hi[slot];
        ++item.span_count;
      }
      if (item.span_count == 2) {
        int64_t& b0 = item.span_begin[0];
        int64_t& e0 = item.span_end[0];
        const int64_t b1 = item.span_begin[1];
        const int64_t e1 = item.span_end[1];
        if (b0 <= e1 && b1 <= e0) {
          // Overlapping or touching spans merge, so no key tile is visited twice.
          b0 = std::min(b0, b1);
          e0 = std::max(e0, e1);
          item.span_count = 1;
        } else if (b1 < b0) {
          std::swap(item.span_begin[0], item.span_begin[1]);
          std::swap(item.span_end[0], item.span_end[1]);
        }
      }
      int64_t total = 0;
      for (int64_t sp = 0; sp < item.span_count; ++sp)
        total += item.span_end[sp] - item.span_begin[sp];
      items.push_back(item);
      cost.push_back(total * (item.end - item.begin));
    }
  }
  std::vector<int64_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return cost[a] > cost[b]; });
  std::vector<TileItem> sorted;
  sorted.reserve(items.size());
  for (int64_t i : order) sorted.push_back(items[i]);
  return sorted;
}

// The items as a device buffer of bytes.
inline at::Tensor ItemsToDevice(const std::vector<TileItem>& items, const at::Device& device) {
  const int64_t bytes = static_cast<int64_t>(items.size() * sizeof(TileItem));
  return at::from_blob(const_cast<TileItem*>(items.data()), {bytes}, at::kByte)
      .to(device, /*non_blocking=*/false);
}

// Opts `kernel` in to `bytes` of dynamic shared memory after checking the
// device allows it.
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

// Throws unless q's dtype and head dim have a CUDA kernel.
inline void CheckSupported(const at::Tensor& q) {
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf,
              "attention: CUDA kernel not available for ", dtype,
              " inputs; use bf16 or fp16 on CUDA (fp32 and fp64 run on CPU)");
  const int64_t d = q.size(2);
  TORCH_CHECK(d == 64 || d == 128 || d == 256,
              "attention: CUDA kernel not available for head dim D = ", d,
              "; it supports 64, 128 and 256");
}

// t contiguous and 16-byte aligned, as cp.async needs; a view that starts
// off alignment is copied.
inline at::Tensor Aligned(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 == 0 ? c : c.clone();
}

// Calls fn(T{}, std::integral_constant<int, D>{}) for the element type
// (__nv_bfloat16 or __half) and head dim (64, 128, 256) of a checked input.
template <typename Fn>
void DispatchHeadDimAndType(at::ScalarType dtype, int64_t head_dim, Fn&& fn) {
  auto by_dim = [&](auto type_tag) {
    switch (head_dim) {
      case 64:
        fn(type_tag, std::integral_constant<int, 64>{});
        break;
      case 128:
        fn(type_tag, std::integral_constant<int, 128>{});
        break;
      default:
        fn(type_tag, std::integral_constant<int, 256>{});
        break;
    }
  };
  if (dtype == at::kBFloat16) {
    by_dim(__nv_bfloat16{});
  } else {
    by_dim(__half{});
  }
}

// Byte offset of the next buffer: every buffer starts 128-byte aligned, more
// than the 32 bytes a wmma pointer and the 16 bytes cp.async need.
constexpr int AlignUp(int bytes) { return (bytes + 127) / 128 * 128; }

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

}  // namespace ballast::kernels::attention_cuda

#endif  // BALLAST_KERNELS_CUDA_ATTENTION_COMMON_CUH_
