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
// fp32 products run on one of three kernels, chosen once per process
// (FloatTileKernel below):
//  - oneDNN's brgemm micro-kernel, through LibTorch's
//    at::native::cpublas::brgemm (the one ATen's own CPU flash attention calls
//    for bf16 and fp16), where LibTorch was built with oneDNN and the CPU has
//    AVX2. It takes the products whose A is row-major (a_depth == 1), whose
//    alpha is 1 and whose sides are multiples of 16 (BrgemmTakes): it has no
//    alpha and no transposed A, and it JIT-compiles and caches one kernel per
//    shape and thread, so the odd-sized edge tiles of packed documents, which
//    would fill that cache with one kernel per length, are left out too. What
//    brgemm does not take goes to the next kernel.
//  - a register-tiled kernel that broadcasts A and streams rows of B
//    (tile_product.cc states the tile), on a CPU with AVX-512F. It copies no
//    operand: these products are small (tens to hundreds on a side) and BLAS
//    packs both operands of each one; in the attention loops that packing was
//    a fifth of the time.
//  - the BLAS that LibTorch links (MKL in the PyPI wheel), for anything else.
// bench/results/attention_brgemm.md compares them inside the attention kernel.
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

enum class TileKernel { kBrgemm, kRegister, kBlas };

// The kernel fp32 products run on, decided at the first call and logged once
// to stderr. The environment variable BALLAST_CPU_TILE_PRODUCT picks one:
// "brgemm", "register" or "blas" (tests cover each path this way); a choice the
// build or CPU cannot run falls back to the next kernel in that order, and the
// log says why. Unset, the first available of brgemm, register, blas. Any
// other value throws a c10::Error that names the variable.
TileKernel FloatTileKernel();

// "brgemm", "register" or "blas".
const char* TileKernelName(TileKernel kernel);

// Whether a product of these sides, alpha and A stride goes to brgemm when it
// is the kernel: alpha 1, A row-major, every side a positive multiple of 16.
bool BrgemmTakes(int64_t rows, int64_t cols, int64_t depth, float alpha, int64_t a_depth);

// Whether this process can run each kernel, whatever the environment asks.
bool BrgemmAvailable();
bool RegisterKernelAvailable();

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_TILE_PRODUCT_H_
