// Register tile: kTileRows rows of C by up to kTileVectors x 16 columns,
// accumulated in 6 x 4 = 24 of AVX-512's 32 vector registers over the whole
// depth, then scaled and stored once. Each step k loads one row of B (up to 64
// floats, the last vector masked to the width) and, for each row, broadcasts
// one element of A and issues one FMA per vector: 24 FMAs against 4 loads and
// 6 broadcasts, so the FMA units, not the loads, set the pace. The columns of C
// are walked in 64-wide panels, and each panel's rows of B stay in L1 while
// every row group of C passes over them.
//
// BLAS path: C row-major (rows, cols) is column-major (cols, rows), which is
// B' (cols, depth) times A' (depth, rows) in BLAS's terms, with B' = B as
// stored and A' either A as stored (a_depth == 1) or its transpose.
#include "kernels/cpu/tile_product.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BALLAST_HAS_AVX512_KERNEL 1
#endif

extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
void dgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const double* alpha, const double* a, const int* lda, const double* b, const int* ldb,
            const double* beta, double* c, const int* ldc);
}

namespace ballast::kernels {
namespace {

// Sizes fit int: tiles are at most a few hundred wide, and the attention front
// end checks H * D < 2^31 for the strides.
template <typename T, typename Blas>
void BlasProduct(Blas gemm, int64_t rows, int64_t cols, int64_t depth, T alpha, const T* a,
                 int64_t a_row, int64_t a_depth, const T* b, int64_t ldb, bool accumulate, T* c,
                 int64_t ldc) {
  const char trans_b = 'N';
  const char trans_a = a_depth == 1 ? 'N' : 'T';
  const int m = static_cast<int>(cols), n = static_cast<int>(rows), k = static_cast<int>(depth);
  const int lda = static_cast<int>(a_depth == 1 ? a_row : a_depth);
  const int ldb_i = static_cast<int>(ldb), ldc_i = static_cast<int>(ldc);
  const T beta = accumulate ? T(1) : T(0);
  gemm(&trans_b, &trans_a, &m, &n, &k, &alpha, b, &ldb_i, a, &lda, &beta, c, &ldc_i);
}

#ifdef BALLAST_HAS_AVX512_KERNEL

constexpr int kTileRows = 6;
constexpr int kTileVectors = 4;
constexpr int64_t kLanes = 16;
constexpr int64_t kPanel = kTileVectors * kLanes;

template <int R, int V>
__attribute__((target("avx512f"))) void RegisterTile(int64_t depth, float alpha, const float* a,
                                                     int64_t a_row, int64_t a_depth, const float* b,
                                                     int64_t ldb, __mmask16 last, bool accumulate,
                                                     float* c, int64_t ldc) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < depth; ++k) {
    const float* b_row = b + k * ldb;
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      bv[v] = v == V - 1 ? _mm512_maskz_loadu_ps(last, b_row + kLanes * v)
                         : _mm512_loadu_ps(b_row + kLanes * v);
    }
    const float* a_k = a + k * a_depth;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 x = _mm512_set1_ps(a_k[r * a_row]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
    }
  }
  const __m512 scale = _mm512_set1_ps(alpha);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      const __mmask16 lanes = v == V - 1 ? last : __mmask16(0xffff);
      float* dst = c + r * ldc + kLanes * v;
      __m512 y = _mm512_mul_ps(acc[r][v], scale);
      if (accumulate) y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(lanes, dst));
      _mm512_mask_storeu_ps(dst, lanes, y);
    }
  }
}

template <int R>
void RegisterTileOfWidth(int vectors, int64_t depth, float alpha, const float* a, int64_t a_row,
                         int64_t a_depth, const float* b, int64_t ldb, __mmask16 last,
                         bool accumulate, float* c, int64_t ldc) {
  switch (vectors) {
    case 1:
      return RegisterTile<R, 1>(depth, alpha, a, a_row, a_depth, b, ldb, last, accumulate, c, ldc);
    case 2:
      return RegisterTile<R, 2>(depth, alpha, a, a_row, a_depth, b, ldb, last, accumulate, c, ldc);
    case 3:
      return RegisterTile<R, 3>(depth, alpha, a, a_row, a_depth, b, ldb, last, accumulate, c, ldc);
    default:
      return RegisterTile<R, 4>(depth, alpha, a, a_row, a_depth, b, ldb, last, accumulate, c, ldc);
  }
}

void RegisterProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                     int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                     float* c, int64_t ldc) {
  static_assert(kTileRows == 6 && kTileVectors == 4, "the switches below list every tile size");
  for (int64_t col = 0; col < cols; col += kPanel) {
    const int64_t width = std::min(kPanel, cols - col);
    const int vectors = static_cast<int>((width + kLanes - 1) / kLanes);
    const int64_t last_width = width - kLanes * (vectors - 1);
    const __mmask16 last = static_cast<__mmask16>((1u << last_width) - 1);
    for (int64_t row = 0; row < rows; row += kTileRows) {
      const float* a_tile = a + row * a_row;
      const float* b_panel = b + col;
      float* c_tile = c + row * ldc + col;
      const auto tile = [&](auto rows_constant) {
        RegisterTileOfWidth<decltype(rows_constant)::value>(vectors, depth, alpha, a_tile, a_row,
                                                            a_depth, b_panel, ldb, last, accumulate,
                                                            c_tile, ldc);
      };
      switch (std::min<int64_t>(kTileRows, rows - row)) {
        case 1:
          tile(std::integral_constant<int, 1>{});
          break;
        case 2:
          tile(std::integral_constant<int, 2>{});
          break;
        case 3:
          tile(std::integral_constant<int, 3>{});
          break;
        case 4:
          tile(std::integral_constant<int, 4>{});
          break;
        case 5:
          tile(std::integral_constant<int, 5>{});
          break;
        default:
          tile(std::integral_constant<int, 6>{});
          break;
      }
    }
  }
}

#endif  // BALLAST_HAS_AVX512_KERNEL

bool DetectRegisterKernel() {
#ifdef BALLAST_HAS_AVX512_KERNEL
  const char* choice = std::getenv("BALLAST_CPU_TILE_PRODUCT");
  if (choice != nullptr && std::strcmp(choice, "blas") == 0) return false;
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

}  // namespace

bool TileProductUsesRegisterKernel() {
  static const bool enabled = DetectRegisterKernel();
  return enabled;
}

void TileProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                 int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                 float* c, int64_t ldc) {
#ifdef BALLAST_HAS_AVX512_KERNEL
  if (TileProductUsesRegisterKernel()) {
    RegisterProduct(rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
    return;
  }
#endif
  BlasProduct(sgemm_, rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
}

void TileProduct(int64_t rows, int64_t cols, int64_t depth, double alpha, const double* a,
                 int64_t a_row, int64_t a_depth, const double* b, int64_t ldb, bool accumulate,
                 double* c, int64_t ldc) {
  BlasProduct(dgemm_, rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
}

}  // namespace ballast::kernels
