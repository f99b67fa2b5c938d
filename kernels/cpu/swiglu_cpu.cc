// With e = exp(-g), s = 1 / (1 + e) = sigmoid(g) and dy the gradient of out:
//   forward:   out = (g / (1 + e)) * u
//   backward:  du  = dy * (g / (1 + e))
//              dg  = ((dy * u) * s) * (1 + g * (1 - s))
// The groupings are ATen's (silu, mul, and their backward formulas), so each
// value differs from the op-by-op result only through exp. Rows are split
// across threads; each row runs kVec lanes at a time, with the tail of a row
// padded rather than computed by a scalar exp, so a value does not depend on
// its column.
#include "kernels/cpu/swiglu_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/vec8.h"

namespace ballast::kernels {
namespace {

BALLAST_VEC_INLINE Vec8f Silu8(Vec8f g) { return g / (1.0f + Exp8(-g)); }

BALLAST_ROW_KERNEL void ForwardRow(const float* g, const float* u, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + kVec <= n; j += kVec) Store8(out + j, Silu8(Load8(g + j)) * Load8(u + j));
  if (j < n) {
    const int64_t rest = n - j;
    StorePartial8(out + j, Silu8(LoadPartial8(g + j, rest, 0.0f)) * LoadPartial8(u + j, rest, 0.0f),
                  rest);
  }
}

BALLAST_VEC_INLINE void Backward8(Vec8f g, Vec8f u, Vec8f dy, Vec8f* dg, Vec8f* du) {
  const Vec8f one_plus_e = 1.0f + Exp8(-g);
  const Vec8f s = 1.0f / one_plus_e;
  *du = dy * (g / one_plus_e);
  *dg = ((dy * u) * s) * (1.0f + g * (1.0f - s));
}

BALLAST_ROW_KERNEL void BackwardRow(const float* g, const float* u, const float* dy, float* dg,
                                    float* du, int64_t n) {
  int64_t j = 0;
  Vec8f dgv, duv;
  for (; j + kVec <= n; j += kVec) {
    Backward8(Load8(g + j), Load8(u + j), Load8(dy + j), &dgv, &duv);
    Store8(dg + j, dgv);
    Store8(du + j, duv);
  }
  if (j < n) {
    const int64_t rest = n - j;
    Backward8(LoadPartial8(g + j, rest, 0.0f), LoadPartial8(u + j, rest, 0.0f),
              LoadPartial8(dy + j, rest, 0.0f), &dgv, &duv);
    StorePartial8(dg + j, dgv, rest);
    StorePartial8(du + j, duv, rest);
  }
}

// Rows per task: about 16k elements, so that small inputs stay on one thread.
int64_t RowGrain(int64_t width) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, width));
}

}  // namespace

at::Tensor swiglu_cpu_forward(const at::Tensor& gate_up) {
  const int64_t rows = gate_up.size(0);
  const int64_t width = gate_up.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, gate_up.options());
  const float* in = gate_up.const_data_ptr<float>();
  float* o = out.mutable_data_ptr<float>();
  const int64_t in_stride = gate_up.stride(0);
  at::parallel_for(0, rows, RowGrain(width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = in + t * in_stride;
      ForwardRow(row, row + width, o + t * width, width);
    }
  });
  return out;
}

at::Tensor swiglu_cpu_backward(const at::Tensor& gate_up, const at::Tensor& d_out) {
  const int64_t rows = gate_up.size(0);
  const int64_t width = gate_up.size(1) / 2;
  at::Tensor d_gate_up = at::empty({rows, 2 * width}, gate_up.options());
  const float* in = gate_up.const_data_ptr<float>();
  const float* dy = d_out.const_data_ptr<float>();
  float* d = d_gate_up.mutable_data_ptr<float>();
  const int64_t in_stride = gate_up.stride(0), dy_stride = d_out.stride(0);
  at::parallel_for(0, rows, RowGrain(2 * width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* row = in + t * in_stride;
      float* d_row = d + t * 2 * width;
      BackwardRow(row, row + width, dy + t * dy_stride, d_row, d_row + width, width);
    }
  });
  return d_gate_up;
}

}  // namespace ballast::kernels
