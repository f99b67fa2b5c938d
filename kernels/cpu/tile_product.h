// The small matrix products inside the CPU attention tiles.
//
//   C[i][c] = alpha * sum_k A(i, k) B(k, c)   (+ C[i][c] when accumulating)
//   i < rows, c < cols, k < depth
//
// B and C are row-major with unit stride along c: b[k * ldb + c],
// c[i * ldc + c]. A is read one element at a time, at a[i * a_row + k * a_depth],
// so a transposed operand is just a different pair of strides; one of the two
// must be 1. No operand is packed or copied.
//
// fp32 on a CPU with AVX-512 runs a register-tiled kernel that broadcasts A
// and streams rows of B (tile_product.cc states the tile); anything else goes
// to the BLAS that LibTorch links (MKL in the PyPI wheel). The register kernel
// exists because these products are small (tens to hundreds on a side) and
// BLAS packs both operands of each one: in the attention loops that packing
// was a fifth of the time, and MKL ran at 0.75-0.85x of this kernel's rate on
// the same tiles.
#ifndef BALLAST_KERNELS_CPU_TILE_PRODUCT_H_
#define BALLAST_KERNELS_CPU_TILE_PRODUCT_H_

#include <cstdint>

namespace ballast::kernels {

void TileProduct(int64_t rows, int64_t cols, int64_t depth, float alpha, const float* a,
                 int64_t a_row, int64_t a_depth, const float* b, int64_t ldb, bool accumulate,
                 float* c, int64_t ldc);

void TileProduct(int64_t rows, int64_t cols, int64_t depth, double alpha, const double* a,
                 int64_t a_row, int64_t a_depth, const double* b, int64_t ldb, bool accumulate,
                 double* c, int64_t ldc);

// Whether fp32 products run the register kernel. False when the CPU lacks
// AVX-512F, or when the environment sets BALLAST_CPU_TILE_PRODUCT=blas (tests
// use it to cover the BLAS path on any machine); any other value of that
// variable throws a c10::Error that names it. Read once, at the first call.
bool TileProductUsesRegisterKernel();

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_TILE_PRODUCT_H_
