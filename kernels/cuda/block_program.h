// Block programs: a CUDA kernel's per-block code written once, as a
// __host__ __device__ function object, so that the same code runs as the
// kernel on a GPU (kernels/cuda/block_program.cuh launches it) and, block
// after block, on the CPU (kernels/cuda/host_launch.h, for the tests). The
// Gated DeltaNet kernels (kernels/cuda/gated_delta_rule_blocks.h,
// causal_conv1d_blocks.h) are written this way so that their indexing and
// chunk math are tested in every build, against the CPU kernels, without a
// GPU; what the host cannot show for certain (a missing barrier, two threads
// writing one element, the launches) is left to the GPU tests.
//
// A body is called as body(block, x, y, z) for every block (x, y, z) of its
// grid. `block` offers tid(), threads(), sync() (a barrier: __syncthreads on
// the device, nothing on the host) and smem, the block's dynamic shared memory
// in floats. A body spreads its work with loops of the form
//   for (i = block.tid(); i < n; i += block.threads())
// and puts a sync() between steps that read what another thread wrote;
// global memory written before a sync() is visible to the whole block after
// it, as shared memory is.
//
// Everything here is fp32 and plain loops; the products are not on tensor
// cores (see the header of gated_delta_rule_blocks.h for why).
#ifndef BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_H_
#define BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_H_

#include <cstdint>

// BALLAST_HD_INLINE for the small helpers that every body calls many times:
// inlined on the device, so that no call passes views through a stack frame.
#if defined(__CUDACC__)
#define BALLAST_HD __host__ __device__
#define BALLAST_HD_INLINE __host__ __device__ __forceinline__
#else
#define BALLAST_HD
#define BALLAST_HD_INLINE inline
#endif

namespace ballast::kernels::block_program {

// Threads per block of every block program.
inline constexpr int kBlockThreads = 256;

// A read-only fp32 matrix view: element (i, j) at p[i * rs + j * cs].
struct In {
  const float* p;
  int64_t rs, cs;
  BALLAST_HD float operator()(int64_t i, int64_t j) const { return p[i * rs + j * cs]; }
  BALLAST_HD In T() const { return {p, cs, rs}; }
};

// A writable fp32 matrix view, likewise.
struct Out {
  float* p;
  int64_t rs, cs;
  BALLAST_HD float& operator()(int64_t i, int64_t j) const { return p[i * rs + j * cs]; }
  BALLAST_HD operator In() const { return {p, rs, cs}; }
  BALLAST_HD In T() const { return {p, cs, rs}; }
};

// C (m, n) = alpha A (m, k) B (k, n), plus C where `accumulate`. Each output
// element belongs to one thread, chosen by (m, n) alone: two products of the
// same m and n into one C need no barrier between them. Each element sums
// over k in order, so the result does not depend on the thread count.
template <class Block>
BALLAST_HD_INLINE void Product(const Block& b, int64_t m, int64_t n, int64_t k, float alpha, In a,
                               In bm, Out c, bool accumulate) {
  for (int64_t idx = b.tid(); idx < m * n; idx += b.threads()) {
    const int64_t i = idx / n, j = idx % n;
    float acc = 0.0f;
    for (int64_t kk = 0; kk < k; ++kk) acc += a(i, kk) * bm(kk, j);
    c(i, j) = accumulate ? c(i, j) + alpha * acc : alpha * acc;
  }
}

// In place, X <- (I + A)^-1 X for A strictly lower triangular (n, n): forward
// substitution, X_i -= sum_{m < i} A_im X_m, one column per thread, over the
// columns of x1 (n, cols1) and then of x2 (n, cols2). Only A's strict lower
// triangle is read.
template <class Block>
BALLAST_HD_INLINE void SolveUnitLower(const Block& b, In a, int64_t n, Out x1, int64_t cols1,
                                      Out x2, int64_t cols2) {
  for (int64_t col = b.tid(); col < cols1 + cols2; col += b.threads()) {
    const Out x = col < cols1 ? x1 : x2;
    const int64_t j = col < cols1 ? col : col - cols1;
    for (int64_t i = 1; i < n; ++i) {
      float s = x(i, j);
      for (int64_t m = 0; m < i; ++m) s -= a(i, m) * x(m, j);
      x(i, j) = s;
    }
  }
}

// In place, X <- (I + A)^-T X: backward substitution, X_i -= sum_{m > i}
// A_mi X_m, one column per thread, as SolveUnitLower.
template <class Block>
BALLAST_HD_INLINE void SolveUnitLowerTransposed(const Block& b, In a, int64_t n, Out x1,
                                                int64_t cols1, Out x2, int64_t cols2) {
  for (int64_t col = b.tid(); col < cols1 + cols2; col += b.threads()) {
    const Out x = col < cols1 ? x1 : x2;
    const int64_t j = col < cols1 ? col : col - cols1;
    for (int64_t i = n - 2; i >= 0; --i) {
      float s = x(i, j);
      for (int64_t m = i + 1; m < n; ++m) s -= a(m, i) * x(m, j);
      x(i, j) = s;
    }
  }
}

// Offsets of a body's shared-memory buffers, taken in order; `used` is the
// total in floats, what the launch asks for.
struct SmemPlan {
  int64_t used = 0;
  BALLAST_HD int64_t Take(int64_t floats) {
    const int64_t at = used;
    used += floats;
    return at;
  }
};

struct Grid {
  int64_t x = 1, y = 1, z = 1;
};

}  // namespace ballast::kernels::block_program

#endif  // BALLAST_KERNELS_CUDA_BLOCK_PROGRAM_H_
