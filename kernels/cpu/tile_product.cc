// Register tile: kTileRows rows of C by up to kTileVectors x 16 columns,
// accumulated in 6 x 4 = 24 of AVX-512's 32 vector registers over the whole
// depth, then scaled and stored once. Each step k loads one row of B (up to 64
// floats, the last vector masked to the width) and, for each row, broadcasts
// one element of A and issues one FMA per vector: 24 FMAs against 4 loads and
// 6 broadcasts, so the FMA units, not the loads, set the pace. The columns of C
// are walked in 64-wide panels, and each panel's rows of B stay in L1 while
// every row group of C passes over them.
//
// brgemm path: at::native::cpublas::brgemm(M, N, K, lda, ldb, ldc, add_C, A,
// B, C) computes C (M, N) (+)= A (M, K) B (K, N), all row-major, which is
// this product with alpha 1 and a_depth 1.
//
// BLAS path: C row-major (rows, cols) is column-major (cols, rows), which is
// B' (cols, depth) times A' (depth, rows) in BLAS's terms, with B' = B as
// stored and A' either A as stored (a_depth == 1) or its transpose.
#include "kernels/cpu/tile_product.h"

#include <ATen/Context.h>
#include <ATen/native/CPUBlas.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernels/cpu/fortran_blas.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BALLAST_HAS_AVX512_KERNEL 1
#endif

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

using RegisterTileFn = void (*)(int64_t, float, const float*, int64_t, int64_t, const float*,
                                int64_t, __mmask16, bool, float*, int64_t);

// Every tile size, by [rows - 1][vectors - 1]: the edges of C get tiles of
// fewer rows and narrower panels.
constexpr RegisterTileFn kRegisterTiles[kTileRows][kTileVectors] = {
    {RegisterTile<1, 1>, RegisterTile<1, 2>, RegisterTile<1, 3>, RegisterTile<1, 4>},
    {RegisterTile<2, 1>, RegisterTile<2, 2>, RegisterTile<2, 3>, RegisterTile<2, 4>},
    {RegisterTile<3, 1>, RegisterTile<3, 2>, RegisterTile<3, 3>, RegisterTile<3, 4>},
    {RegisterTile<4, 1>, RegisterTile<4, 2>, RegisterTile<4, 3>, RegisterTile<4, 4>},
    {RegisterTile<5, 1>, RegisterTile<5, 2>, RegisterTile<5, 3>, RegisterTile<5, 4>},
    {RegisterTile<6, 1>, RegisterTile<6, 2>, RegisterTile<6, 3>, RegisterTile<6, 4>},
};

void RegisterProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                     int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                     float* c, int64_t ldc) {
  for (int64_t col = 0; col < cols; col += kPanel) {
    const int64_t width = std::min(kPanel, cols - col);
    const int64_t vectors = (width + kLanes - 1) / kLanes;
    const int64_t last_width = width - kLanes * (vectors - 1);
    const __mmask16 last = static_cast<__mmask16>((1u << last_width) - 1);
    for (int64_t row = 0; row < rows; row += kTileRows) {
      const int64_t tile_rows = std::min<int64_t>(kTileRows, rows - row);
      kRegisterTiles[tile_rows - 1][vectors - 1](depth, alpha, a + row * a_row, a_row, a_depth,
                                                 b + col, ldb, last, accumulate,
                                                 c + row * ldc + col, ldc);
    }
  }
}

#endif  // BALLAST_HAS_AVX512_KERNEL

#if defined(CPUBLAS_BRGEMM_F32F32F32) && (defined(__x86_64__) || defined(_M_X64))
#define BALLAST_HAS_BRGEMM 1
#endif

// The products brgemm cannot take (see tile_product.h) run here.
void FallbackProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                     int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                     float* c, int64_t ldc) {
#ifdef BALLAST_HAS_AVX512_KERNEL
  if (RegisterKernelAvailable()) {
    RegisterProduct(rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
    return;
  }
#endif
  BlasProduct(sgemm_, rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
}

bool Available(TileKernel kernel) {
  switch (kernel) {
    case TileKernel::kBrgemm:
      return BrgemmAvailable();
    case TileKernel::kRegister:
      return RegisterKernelAvailable();
    case TileKernel::kBlas:
      return true;
  }
  return false;
}

TileKernel ChooseFloatTileKernel() {
  const char* env = std::getenv("BALLAST_CPU_TILE_PRODUCT");
  const std::string choice = env == nullptr ? "" : env;
  TileKernel first = TileKernel::kBrgemm;
  if (choice == "register") {
    first = TileKernel::kRegister;
  } else if (choice == "blas") {
    first = TileKernel::kBlas;
  } else {
    TORCH_CHECK(choice.empty() || choice == "brgemm",
                "BALLAST_CPU_TILE_PRODUCT must be unset, 'brgemm', 'register' or 'blas', got '",
                choice, "'");
  }
  // The order of preference from the first choice on: brgemm, register, blas.
  TileKernel kernel = first;
  while (!Available(kernel)) kernel = static_cast<TileKernel>(static_cast<int>(kernel) + 1);
  std::string why = choice.empty() ? "" : "; BALLAST_CPU_TILE_PRODUCT=" + choice;
  if (kernel != first) {
    why += std::string("; ") + TileKernelName(first) + " unavailable (" +
           (first == TileKernel::kBrgemm ? "no oneDNN in LibTorch, or no AVX2" : "no AVX-512F") +
           ")";
  }
  std::fprintf(stderr, "tile_product: fp32 tile products on %s%s\n", TileKernelName(kernel),
               why.c_str());
  return kernel;
}

}  // namespace

bool BrgemmAvailable() {
#ifdef BALLAST_HAS_BRGEMM
  // LibTorch runs brgemm on oneDNN where it was built with it and the CPU has
  // AVX2 (and the user has not turned oneDNN off); otherwise the same call
  // silently becomes a BLAS gemm, which BALLAST_CPU_TILE_PRODUCT=blas covers.
  static const bool available = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() &&
                                __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return available;
#else
  return false;
#endif
}

bool RegisterKernelAvailable() {
#ifdef BALLAST_HAS_AVX512_KERNEL
  static const bool available = __builtin_cpu_supports("avx512f");
  return available;
#else
  return false;
#endif
}

const char* TileKernelName(TileKernel kernel) {
  switch (kernel) {
    case TileKernel::kBrgemm:
      return "brgemm";
    case TileKernel::kRegister:
      return "register";
    case TileKernel::kBlas:
      return "blas";
  }
  return "unknown";
}

bool BrgemmTakes(int64_t rows, int64_t cols, int64_t depth, float alpha, int64_t a_depth) {
  constexpr int64_t kQuantum = 16;
  return alpha == 1.0f && a_depth == 1 && rows > 0 && cols > 0 && depth > 0 &&
         rows % kQuantum == 0 && cols % kQuantum == 0 && depth % kQuantum == 0;
}

TileKernel FloatTileKernel() {
  static const TileKernel kernel = ChooseFloatTileKernel();
  return kernel;
}

void TileProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                 int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                 float* c, int64_t ldc) {
  switch (FloatTileKernel()) {
    case TileKernel::kBrgemm:
#ifdef BALLAST_HAS_BRGEMM
      if (BrgemmTakes(rows, cols, depth, alpha, a_depth)) {
        at::native::cpublas::brgemm(rows, cols, depth, a_row, ldb, ldc, accumulate, a, b, c,
                                    /*is_vnni=*/false);
        return;
      }
#endif
      [[fallthrough]];
    case TileKernel::kRegister:
      FallbackProduct(rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
      return;
    case TileKernel::kBlas:
      break;
  }
  BlasProduct(sgemm_, rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
}

void TileProduct(int64_t rows, int64_t cols, int64_t depth, double alpha, const double* a,
                 int64_t a_row, int64_t a_depth, const double* b, int64_t ldb, bool accumulate,
                 double* c, int64_t ldc) {
  BlasProduct(dgemm_, rows, cols, depth, alpha, a, a_row, a_depth, b, ldb, accumulate, c, ldc);
}

}  // namespace ballast::kernels
