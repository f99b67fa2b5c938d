// The depthwise causal conv1d + SiLU on CPU, per document, in fp32.
//
// For token t of document n (tokens [s, e)), channel c and K taps:
//   a[t, c] = sum_{j < K} w[c, j] x~[t - (K - 1) + j, c],   y = a sigmoid(a)
// where x~[i] = x[i] for i >= s and the document's window (or 0) for i < s.
// Backward, with a recomputed rather than kept:
//   da = dy sigmoid(a) (1 + a (1 - sigmoid(a)))
//   dx[i, c]      = sum_j w[c, j] da[i + (K - 1) - j, c]   over the terms inside [s, e)
//   dwindow[n][c][p] = the same sum for i = s - (K - 1) + p
//   dw[c, j]      = sum_t da[t, c] x~[t - (K - 1) + j, c]
// Work items are blocks of up to kRows tokens of one document, vectorised over
// channels; dw is summed per item and the items are added in order, so the
// result does not depend on the thread count. Memory: x and weight are kept,
// the backward holds da (T, C) and one (K, C) partial per item.
#include "kernels/cpu/causal_conv1d_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/vec8.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kRows = 64;

struct Block {
  int64_t doc, begin, end, doc_begin, doc_end;
};

// The problem in fp32: x rows (stride ldx), weight as (K, C), windows as
// (N, K - 1, C), and the blocks of work.
struct Conv {
  int64_t tokens, channels, taps, docs;
  at::Tensor x, wt, window, zeros;
  int64_t ldx;
  std::vector<Block> blocks;

  // Row x~[i] of document b.doc, i may be before its start.
  const float* Row(const Block& b, int64_t i) const {
    if (i >= b.doc_begin) return x.const_data_ptr<float>() + i * ldx;
    if (!window.defined()) return zeros.const_data_ptr<float>();
    return window.const_data_ptr<float>() +
           (b.doc * (taps - 1) + (taps - 1) + (i - b.doc_begin)) * channels;
  }
};

Conv MakeConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cu_seqlens,
              const at::Tensor& initial_window) {
  Conv p;
  p.tokens = x.size(0);
  p.channels = x.size(1);
  p.taps = weight.size(1);
  p.x = x.to(at::kFloat);
  if (p.x.stride(1) != 1) p.x = p.x.contiguous();
  p.ldx = p.x.stride(0);
  p.wt = weight.to(at::kFloat).t().contiguous();
  if (initial_window.defined())
    p.window = initial_window.to(at::kFloat).transpose(1, 2).contiguous();
  p.zeros = at::zeros({p.channels}, p.x.options());
  const at::Tensor cu = cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  p.docs = cu.numel() - 1;
  for (int64_t n = 0; n < p.docs; ++n)
    for (int64_t t = c[n]; t < c[n + 1]; t += kRows)
      p.blocks.push_back({n, t, std::min(t + kRows, c[n + 1]), c[n], c[n + 1]});
  return p;
}

BALLAST_VEC_INLINE Vec8f Sigmoid8(Vec8f a) { return 1.0f / (1.0f + Exp8(-a)); }

// a (C) for token t of block b.
BALLAST_ROW_KERNEL void PreActivation(const Conv& p, const Block& b, int64_t t, float* a) {
  const int64_t ch = p.channels;
  const float* w = p.wt.const_data_ptr<float>();
  std::fill(a, a + ch, 0.0f);
  for (int64_t j = 0; j < p.taps; ++j) {
    const float* src = p.Row(b, t - (p.taps - 1) + j);
    const float* wj = w + j * ch;
    int64_t c = 0;
    for (; c + kVec <= ch; c += kVec) Store8(a + c, Load8(a + c) + Load8(wj + c) * Load8(src + c));
    for (; c < ch; ++c) a[c] += wj[c] * src[c];
  }
}

// y = a sigmoid(a), or with dy: da = dy sigmoid(a) (1 + a (1 - sigmoid(a))), in place in a.
BALLAST_ROW_KERNEL void Activate(float* a, const float* dy, int64_t n) {
  int64_t c = 0;
  for (; c + kVec <= n; c += kVec) {
    const Vec8f x = Load8(a + c), s = Sigmoid8(x);
    Store8(a + c, dy == nullptr ? x * s : Load8(dy + c) * s * (1.0f + x * (1.0f - s)));
  }
  if (c < n) {
    const int64_t rest = n - c;
    const Vec8f x = LoadPartial8(a + c, rest, 0.0f), s = Sigmoid8(x);
    StorePartial8(
        a + c,
        dy == nullptr ? x * s : LoadPartial8(dy + c, rest, 0.0f) * s * (1.0f + x * (1.0f - s)),
        rest);
  }
}

}  // namespace

at::Tensor causal_conv1d_silu_cpu_forward(const at::Tensor& x, const at::Tensor& weight,
                                          const at::Tensor& cu_seqlens,
                                          const at::Tensor& initial_window) {
  const Conv p = MakeConv(x, weight, cu_seqlens, initial_window);
  at::Tensor y = at::empty({p.tokens, p.channels}, p.x.options());
  float* yp = y.mutable_data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(p.blocks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Block& b = p.blocks[i];
      for (int64_t t = b.begin; t < b.end; ++t) {
        PreActivation(p, b, t, yp + t * p.channels);
        Activate(yp + t * p.channels, nullptr, p.channels);
      }
    }
  });
  return y.to(x.scalar_type());
}

CausalConv1dGrads causal_conv1d_silu_cpu_backward(const at::Tensor& x, const at::Tensor& weight,
                                                  const at::Tensor& cu_seqlens,
                                                  const at::Tensor& initial_window,
                                                  const at::Tensor& dy) {
  const Conv p = MakeConv(x, weight, cu_seqlens, initial_window);
  const int64_t ch = p.channels, taps = p.taps;
  const int64_t blocks = static_cast<int64_t>(p.blocks.size());
  const at::Tensor dyf = dy.to(at::kFloat).contiguous();
  const float* dyp = dyf.const_data_ptr<float>();
  const float* w = p.wt.const_data_ptr<float>();
  at::Tensor da = at::empty({p.tokens, ch}, p.x.options());
  at::Tensor partial = at::zeros({std::max<int64_t>(blocks, 1), taps, ch}, p.x.options());
  float* dap = da.mutable_data_ptr<float>();
  float* pp = partial.mutable_data_ptr<float>();
  // da, then each block's share of dw.
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Block& b = p.blocks[i];
      for (int64_t t = b.begin; t < b.end; ++t) {
        float* row = dap + t * ch;
        PreActivation(p, b, t, row);
        Activate(row, dyp + t * ch, ch);
        for (int64_t j = 0; j < taps; ++j) {
          const float* src = p.Row(b, t - (taps - 1) + j);
          float* dw = pp + (i * taps + j) * ch;
          for (int64_t c = 0; c < ch; ++c) dw[c] += row[c] * src[c];
        }
      }
    }
  });
  // dx[i] = sum_j w[j] da[i + (K - 1) - j] within the document; i from
  // s - (K - 1) (the window) to e - 1.
  CausalConv1dGrads grads;
  at::Tensor dx = at::empty({p.tokens, ch}, p.x.options());
  at::Tensor dwin;
  if (p.window.defined()) dwin = at::zeros({p.docs, taps - 1, ch}, p.x.options());
  float* dxp = dx.mutable_data_ptr<float>();
  float* dwinp = dwin.defined() ? dwin.mutable_data_ptr<float>() : nullptr;
  auto gather = [&](const Block& b, int64_t i, float* out) {
    std::fill(out, out + ch, 0.0f);
    for (int64_t j = 0; j < taps; ++j) {
      const int64_t t = i + (taps - 1) - j;
      if (t < b.doc_begin || t >= b.doc_end) continue;
      const float* wj = w + j * ch;
      const float* d = dap + t * ch;
      for (int64_t c = 0; c < ch; ++c) out[c] += wj[c] * d[c];
    }
  };
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Block& b = p.blocks[i];
      for (int64_t t = b.begin; t < b.end; ++t) gather(b, t, dxp + t * ch);
      if (dwinp != nullptr && b.begin == b.doc_begin) {
        for (int64_t q = 0; q < taps - 1; ++q)
          gather(b, b.doc_begin - (taps - 1) + q, dwinp + (b.doc * (taps - 1) + q) * ch);
      }
    }
  });
  at::Tensor dwt = at::zeros({taps, ch}, p.x.options());
  float* dwp = dwt.mutable_data_ptr<float>();
  for (int64_t i = 0; i < blocks; ++i)
    for (int64_t j = 0; j < taps * ch; ++j) dwp[j] += pp[i * taps * ch + j];
  grads.d_x = dx.to(x.scalar_type());
  grads.d_weight = dwt.t().contiguous().to(weight.scalar_type());
  if (dwin.defined())
    grads.d_window = dwin.transpose(1, 2).contiguous().to(initial_window.scalar_type());
  return grads;
}

}  // namespace ballast::kernels
