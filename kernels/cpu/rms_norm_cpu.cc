// Each row is two passes over its H values in each direction, kVec lanes at a
// time with the row's tail padded with zeros (which add nothing to the sums):
//   forward:   ss = sum x^2,  r = 1 / sqrt(ss / H + eps),  y = w * (x * r)
//   backward:  n = x * r,  dn = dy * w,  c = sum(dn * n) / H,
//              dx = r * (dn - n * c),  dw += dy * n
// HF computes n = x * rsqrt(mean(x^2) + eps) and then weight * n, which is
// the grouping here. Rows go to threads in blocks of about 16k values; the
// weight gradient is summed per block and the blocks are added in order.
#include "kernels/cpu/rms_norm_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/vec8.h"

namespace ballast::kernels {
namespace {

// Returns r and writes y.
BALLAST_ROW_KERNEL float ForwardRow(const float* x, const float* w, float* y, int64_t n,
                                    float eps) {
  Vec8f squares{};
  int64_t j = 0;
  for (; j + kVec <= n; j += kVec) {
    const Vec8f v = Load8(x + j);
    squares += v * v;
  }
  const int64_t rest = n - j;
  if (rest > 0) {
    const Vec8f v = LoadPartial8(x + j, rest, 0.0f);
    squares += v * v;
  }
  const float r = 1.0f / std::sqrt(HorizontalSum(squares) / static_cast<float>(n) + eps);
  for (j = 0; j + kVec <= n; j += kVec) Store8(y + j, Load8(w + j) * (Load8(x + j) * r));
  if (rest > 0) {
    StorePartial8(y + j, LoadPartial8(w + j, rest, 0.0f) * (LoadPartial8(x + j, rest, 0.0f) * r),
                  rest);
  }
  return r;
}

BALLAST_VEC_INLINE void BackwardLanes(Vec8f x, Vec8f w, Vec8f dy, float r, float c, Vec8f* dx,
                                      Vec8f* dw) {
  const Vec8f n = x * r;
  *dx = r * (dy * w - n * c);
  *dw = dy * n;
}

// Writes dx and, when dw is not null, adds dy * n to it.
BALLAST_ROW_KERNEL void BackwardRow(const float* x, const float* w, const float* dy, float r,
                                    float* dx, float* dw, int64_t n) {
  const int64_t whole = n - n % kVec, rest = n - whole;
  Vec8f dots{};
  for (int64_t j = 0; j < whole; j += kVec)
    dots += (Load8(dy + j) * Load8(w + j)) * (Load8(x + j) * r);
  if (rest > 0) {
    dots += (LoadPartial8(dy + whole, rest, 0.0f) * LoadPartial8(w + whole, rest, 0.0f)) *
            (LoadPartial8(x + whole, rest, 0.0f) * r);
  }
  const float c = HorizontalSum(dots) / static_cast<float>(n);
  Vec8f dxv, dwv;
  for (int64_t j = 0; j < whole; j += kVec) {
    BackwardLanes(Load8(x + j), Load8(w + j), Load8(dy + j), r, c, &dxv, &dwv);
    Store8(dx + j, dxv);
    if (dw != nullptr) Store8(dw + j, Load8(dw + j) + dwv);
  }
  if (rest > 0) {
    BackwardLanes(LoadPartial8(x + whole, rest, 0.0f), LoadPartial8(w + whole, rest, 0.0f),
                  LoadPartial8(dy + whole, rest, 0.0f), r, c, &dxv, &dwv);
    StorePartial8(dx + whole, dxv, rest);
    if (dw != nullptr) StorePartial8(dw + whole, LoadPartial8(dw + whole, rest, 0.0f) + dwv, rest);
  }
}

// Rows per block: about 16k values, and a function of H alone, so that the
// blocks (and the weight gradient's summation order) do not depend on threads.
int64_t RowsPerBlock(int64_t h) { return std::max<int64_t>(1, 16384 / h); }

}  // namespace

RmsNormForward rms_norm_cpu_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const int64_t tokens = x.size(0), groups = x.size(1), h = x.size(2);
  const int64_t rows = tokens * groups;
  RmsNormForward out{at::empty({rows, h}, x.options()), at::empty({rows}, x.options())};
  const float* xp = x.const_data_ptr<float>();
  const at::Tensor w = weight.contiguous();
  const float* wp = w.const_data_ptr<float>();
  float* yp = out.y.mutable_data_ptr<float>();
  float* rp = out.rstd.mutable_data_ptr<float>();
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  const float eps_f = static_cast<float>(eps);
  at::parallel_for(0, rows, RowsPerBlock(h), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* row = xp + (i / groups) * s0 + (i % groups) * s1;
      rp[i] = ForwardRow(row, wp, yp + i * h, h, eps_f);
    }
  });
  return out;
}

RmsNormGrads rms_norm_cpu_backward(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& rstd, const at::Tensor& dy,
                                   bool need_weight_grad) {
  const int64_t groups = x.size(1), h = x.size(2);
  const int64_t rows = x.size(0) * groups;
  const int64_t block = RowsPerBlock(h);
  const int64_t blocks = (rows + block - 1) / block;
  RmsNormGrads grads{at::empty({rows, h}, x.options()), at::Tensor()};
  at::Tensor partial;  // (blocks, H): each block's share of dweight
  if (need_weight_grad) partial = at::zeros({blocks, h}, x.options());
  const float* xp = x.const_data_ptr<float>();
  const at::Tensor w = weight.contiguous();
  const float* wp = w.const_data_ptr<float>();
  const float* rp = rstd.const_data_ptr<float>();
  const float* dyp = dy.const_data_ptr<float>();
  float* dxp = grads.d_x.mutable_data_ptr<float>();
  float* pp = need_weight_grad ? partial.mutable_data_ptr<float>() : nullptr;
  const int64_t s0 = x.stride(0), s1 = x.stride(1);
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      float* dw = pp != nullptr ? pp + b * h : nullptr;
      for (int64_t i = b * block; i < std::min(rows, (b + 1) * block); ++i) {
        const float* row = xp + (i / groups) * s0 + (i % groups) * s1;
        BackwardRow(row, wp, dyp + i * h, rp[i], dxp + i * h, dw, h);
      }
    }
  });
  if (need_weight_grad) {
    grads.d_weight = at::zeros({h}, x.options());
    float* dw = grads.d_weight.mutable_data_ptr<float>();
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t j = 0; j < h; ++j) dw[j] += pp[b * h + j];
  }
  return grads;
}

}  // namespace ballast::kernels
