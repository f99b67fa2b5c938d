// The three grouped products cut into fixed output tiles: each tile of an
// expert's output block is one BLAS call (the sgemm LibTorch links, MKL in
// the PyPI wheel) over the whole depth, written by the one thread that runs it.
//
//   forward       y[seg_e]   (n_e x out) = x[seg_e] . W_e^T       depth in
//   input grad    d_x[seg_e] (n_e x in)  = d_y[seg_e] . W_e       depth out
//   weight grad   d_W_e      (out x in)  = d_y[seg_e]^T . x[seg_e] depth n_e
//
// Why tiles and not one call per expert: a busy expert would then be one
// thread's work while the others wait; tiles of kTileRows x kTileCols split it,
// and the threads take tiles, the largest first, from a shared counter, so
// the work divides by FLOPs whatever the routing.
//
// Determinism: the tiles, and so every BLAS call's shape and operands, do not
// depend on the thread count, no sum crosses a tile, and inside the parallel
// region BLAS runs single-threaded (a nested OpenMP region). The result is
// the same bits at any thread count; the weight gradient needs no atomics.
//
// bfloat16 operands are widened to fp32 once, whole, and the fp32 result is
// rounded once: BLAS has no bf16 product with fp32 accumulation on CPUs
// without AVX-512 BF16, and widening costs O(size) against the product's
// O(size x depth).
#include "kernels/cpu/grouped_linear_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/fortran_blas.h"

namespace ballast::kernels {
namespace {

// 512 x 768 fp32 tiles: each call's packed panel of the second operand
// (768 x depth) is reused by up to 512 rows, enough for MKL's single-threaded
// sgemm to run at 93% of a dense at::mm's rate (bench/moe_layer.py, 2 threads,
// AMD EPYC with AVX-512: 81-85% with 256 x 256 tiles, 94% with 1024 x 768),
// while a layer of Qwen3-30B-A3B's shape still cuts into more tiles than a
// CPU has threads (64 experts x 2-3 column tiles at 4k tokens).
constexpr int64_t kTileRows = 512;
constexpr int64_t kTileCols = 768;

// One expert's output block, as BLAS sees it.
struct Block {
  int64_t rows = 0, cols = 0, depth = 0;
};

struct Tile {
  int64_t expert, row, rows, col, cols;
  double flops;
};

void Gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const float* a,
          const int* lda, const float* b, const int* ldb, float* c, const int* ldc) {
  const float one = 1, zero = 0;
  sgemm_(ta, tb, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc);
}

void Gemm(const char* ta, const char* tb, const int* m, const int* n, const int* k, const double* a,
          const int* lda, const double* b, const int* ldb, double* c, const int* ldc) {
  const double one = 1, zero = 0;
  dgemm_(ta, tb, m, n, k, &one, a, lda, b, ldb, &zero, c, ldc);
}

// Row-major C (m x n, ldc) = op(A) . op(B) with op(A) m x k and op(B) k x n.
// A is stored m x k, or k x m when a_transposed; B k x n, or n x k when
// b_transposed. BLAS is column-major: it sees row-major C as C^T = op(B)^T .
// op(A)^T, and reads a row-major matrix as its transpose. Tiles and leading
// dimensions fit int (grouped_linear() checks the widths).
template <typename T>
void RowMajorProduct(bool a_transposed, bool b_transposed, int64_t m, int64_t n, int64_t k,
                     const T* a, int64_t lda, const T* b, int64_t ldb, T* c, int64_t ldc) {
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, T(0));
    return;
  }
  const char ta = b_transposed ? 'T' : 'N', tb = a_transposed ? 'T' : 'N';
  const int mi = static_cast<int>(n), ni = static_cast<int>(m), ki = static_cast<int>(k);
  const int lda_i = static_cast<int>(ldb), ldb_i = static_cast<int>(lda);
  const int ldc_i = static_cast<int>(ldc);
  Gemm(&ta, &tb, &mi, &ni, &ki, b, &lda_i, a, &ldb_i, c, &ldc_i);
}

// Runs `run(tile)` for every tile of every expert's block, on all of ATen's
// threads, largest tiles first.
template <typename Run>
void ForEachTile(const std::vector<Block>& blocks, const Run& run) {
  std::vector<Tile> tiles;
  for (int64_t e = 0; e < static_cast<int64_t>(blocks.size()); ++e) {
    const Block& b = blocks[e];
    for (int64_t r = 0; r < b.rows; r += kTileRows) {
      for (int64_t c = 0; c < b.cols; c += kTileCols) {
        const int64_t rows = std::min(kTileRows, b.rows - r);
        const int64_t cols = std::min(kTileCols, b.cols - c);
        tiles.push_back({e, r, rows, c, cols, 2.0 * rows * cols * std::max<int64_t>(b.depth, 1)});
      }
    }
  }
  std::stable_sort(tiles.begin(), tiles.end(),
                   [](const Tile& a, const Tile& b) { return a.flops > b.flops; });
  std::atomic<size_t> next{0};
  // Every thread joins even when there are fewer tiles, so that BLAS always
  // runs inside the parallel region, single-threaded (see the file comment).
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1); i < tiles.size(); i = next.fetch_add(1)) run(tiles[i]);
  });
}

std::vector<int64_t> SegmentStarts(const at::Tensor& offsets) {
  const int32_t* ends = offsets.const_data_ptr<int32_t>();
  std::vector<int64_t> starts(offsets.numel() + 1, 0);
  for (int64_t e = 0; e < offsets.numel(); ++e) starts[e + 1] = ends[e];
  return starts;  // starts[e], starts[e + 1]: expert e's rows
}

template <typename T>
void Forward(const at::Tensor& x, const at::Tensor& weight, const std::vector<int64_t>& seg,
             at::Tensor& y) {
  const int64_t experts = weight.size(0), out = weight.size(1), in = weight.size(2);
  const T* xp = x.const_data_ptr<T>();
  const T* wp = weight.const_data_ptr<T>();
  T* yp = y.mutable_data_ptr<T>();
  std::vector<Block> blocks(experts);
  for (int64_t e = 0; e < experts; ++e) blocks[e] = {seg[e + 1] - seg[e], out, in};
  ForEachTile(blocks, [&](const Tile& t) {
    const int64_t row = seg[t.expert] + t.row;
    RowMajorProduct<T>(false, true, t.rows, t.cols, in, xp + row * in, in,
                       wp + (t.expert * out + t.col) * in, in, yp + row * out + t.col, out);
  });
}

template <typename T>
void InputGrad(const at::Tensor& d_y, const at::Tensor& weight, const std::vector<int64_t>& seg,
               at::Tensor& d_x) {
  const int64_t experts = weight.size(0), out = weight.size(1), in = weight.size(2);
  const T* dyp = d_y.const_data_ptr<T>();
  const T* wp = weight.const_data_ptr<T>();
  T* dxp = d_x.mutable_data_ptr<T>();
  std::vector<Block> blocks(experts);
  for (int64_t e = 0; e < experts; ++e) blocks[e] = {seg[e + 1] - seg[e], in, out};
  ForEachTile(blocks, [&](const Tile& t) {
    const int64_t row = seg[t.expert] + t.row;
    RowMajorProduct<T>(false, false, t.rows, t.cols, out, dyp + row * out, out,
                       wp + t.expert * out * in + t.col, in, dxp + row * in + t.col, in);
  });
}

template <typename T>
void WeightGrad(const at::Tensor& d_y, const at::Tensor& x, const std::vector<int64_t>& seg,
                at::Tensor& d_w) {
  const int64_t experts = d_w.size(0), out = d_w.size(1), in = d_w.size(2);
  const T* dyp = d_y.const_data_ptr<T>();
  const T* xp = x.const_data_ptr<T>();
  T* dwp = d_w.mutable_data_ptr<T>();
  std::vector<Block> blocks(experts);
  for (int64_t e = 0; e < experts; ++e) blocks[e] = {out, in, seg[e + 1] - seg[e]};
  ForEachTile(blocks, [&](const Tile& t) {
    const int64_t first = seg[t.expert], depth = seg[t.expert + 1] - first;
    RowMajorProduct<T>(true, false, t.rows, t.cols, depth, dyp + first * out + t.row, out,
                       xp + first * in + t.col, in, dwp + (t.expert * out + t.row) * in + t.col,
                       in);
  });
}

// Widens bf16 to fp32 (see the file comment); other dtypes pass through.
at::Tensor Compute(const at::Tensor& t) {
  return (t.scalar_type() == at::kBFloat16 ? t.to(at::kFloat) : t).contiguous();
}

}  // namespace

at::Tensor grouped_linear_cpu_forward(const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& offsets) {
  const at::Tensor xc = Compute(x), wc = Compute(weight);
  at::Tensor y = at::empty({x.size(0), weight.size(1)}, xc.options());
  const std::vector<int64_t> seg = SegmentStarts(offsets);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "grouped_linear_cpu_forward",
                             [&] { Forward<scalar_t>(xc, wc, seg, y); });
  return y.to(x.scalar_type());
}

at::Tensor grouped_linear_cpu_input_grad(const at::Tensor& d_y, const at::Tensor& weight,
                                         const at::Tensor& offsets) {
  const at::Tensor dyc = Compute(d_y), wc = Compute(weight);
  at::Tensor d_x = at::empty({d_y.size(0), weight.size(2)}, dyc.options());
  const std::vector<int64_t> seg = SegmentStarts(offsets);
  AT_DISPATCH_FLOATING_TYPES(dyc.scalar_type(), "grouped_linear_cpu_input_grad",
                             [&] { InputGrad<scalar_t>(dyc, wc, seg, d_x); });
  return d_x.to(d_y.scalar_type());
}

at::Tensor grouped_linear_cpu_weight_grad(const at::Tensor& d_y, const at::Tensor& x,
                                          const at::Tensor& offsets) {
  const at::Tensor dyc = Compute(d_y), xc = Compute(x);
  at::Tensor d_w = at::empty({offsets.size(0), d_y.size(1), x.size(1)}, dyc.options());
  const std::vector<int64_t> seg = SegmentStarts(offsets);
  AT_DISPATCH_FLOATING_TYPES(dyc.scalar_type(), "grouped_linear_cpu_weight_grad",
                             [&] { WeightGrad<scalar_t>(dyc, xc, seg, d_w); });
  return d_w.to(d_y.scalar_type());
}

}  // namespace ballast::kernels
