// The depthwise causal conv1d + SiLU on CUDA as block programs
// (kernels/cuda/block_program.h): the formulas of kernels/cpu/
// causal_conv1d_cpu.cc, one thread per channel over a block of kRows tokens
// of the packed row. kernels/cuda/causal_conv1d.cu runs the passes with the
// CUDA launcher; the unit tests run them with HostLaunch on the CPU.
//
//   Forward   (token block, channel block)  y = a sigmoid(a).
//   Backward  (token block, channel block)  da, recomputing a;
//             (token block, channel block)  dx from da within the document,
//                                           and the block's share of dw;
//             (document, channel block)     the window's gradient.
// Each token finds its document by binary search in cu_seqlens; x before a
// document's start is read from its window (or is 0), never from the
// previous document. dw sums the blocks' shares in block order, so the
// result does not depend on the schedule. Memory: x, weight and the window
// in fp32, and da (T, C) in the backward.
#ifndef BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_BLOCKS_H_
#define BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_BLOCKS_H_

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/causal_conv1d_cpu.h"
#include "kernels/cuda/block_program.h"

namespace ballast::kernels::conv_blocks {

using block_program::Grid;
using block_program::kBlockThreads;

inline constexpr int64_t kRows = 64;  // tokens per block

struct ConvProblem {
  const float* x;       // (T, C)
  const float* wt;      // (K, C): the weight transposed
  const float* window;  // (N, K - 1, C) or null
  const int64_t* cu;    // (N + 1)
  int64_t tokens, channels, taps, docs;

  // The document of token t < T: the last n with cu[n] <= t (empty
  // documents before it share its start).
  BALLAST_HD_INLINE int64_t DocOf(int64_t t) const {
    int64_t lo = 0, hi = docs - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (cu[mid] <= t) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  // x~[i, c] of document n: x, or the window before the document's start.
  BALLAST_HD_INLINE float Source(int64_t n, int64_t i, int64_t c) const {
    if (i >= cu[n]) return x[i * channels + c];
    if (window == nullptr) return 0.0f;
    return window[(n * (taps - 1) + (taps - 1) + (i - cu[n])) * channels + c];
  }
  BALLAST_HD_INLINE float PreActivation(int64_t n, int64_t t, int64_t c) const {
    float a = 0.0f;
    for (int64_t j = 0; j < taps; ++j) a += wt[j * channels + c] * Source(n, t - (taps - 1) + j, c);
    return a;
  }
  BALLAST_HD Grid TokenGrid() const {
    return {(tokens + kRows - 1) / kRows, (channels + kBlockThreads - 1) / kBlockThreads, 1};
  }
};

BALLAST_HD_INLINE float Sigmoid(float a) { return 1.0f / (1.0f + expf(-a)); }

// Calls fn(t, c) for the tokens of token block x and the channels of
// channel block y that this thread owns.
template <class Block, class Fn>
BALLAST_HD_INLINE void ForEachOwned(const Block& b, const ConvProblem& p, int64_t x, int64_t y,
                                    const Fn& fn) {
  const int64_t t_end = (x + 1) * kRows < p.tokens ? (x + 1) * kRows : p.tokens;
  for (int64_t c = y * kBlockThreads + b.tid(); c < (y + 1) * kBlockThreads && c < p.channels;
       c += b.threads())
    for (int64_t t = x * kRows; t < t_end; ++t) fn(t, c);
}

// y = a sigmoid(a), fp32 (T, C).
struct ForwardBody {
  ConvProblem p;
  float* y;
  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t x, int64_t yb, int64_t) const {
    ForEachOwned(b, p, x, yb, [&](int64_t t, int64_t c) {
      const float a = p.PreActivation(p.DocOf(t), t, c);
      y[t * p.channels + c] = a * Sigmoid(a);
    });
  }
};

// da = dy sigmoid(a) (1 + a (1 - sigmoid(a))), fp32 (T, C).
struct ActivationGradBody {
  ConvProblem p;
  const float* dy;
  float* da;
  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t x, int64_t yb, int64_t) const {
    ForEachOwned(b, p, x, yb, [&](int64_t t, int64_t c) {
      const float a = p.PreActivation(p.DocOf(t), t, c);
      const float s = Sigmoid(a);
      da[t * p.channels + c] = dy[t * p.channels + c] * s * (1.0f + a * (1.0f - s));
    });
  }
};

// dx[i, c] = sum_j w[c, j] da[i + (K - 1) - j, c] over the terms inside i's
// document, and partial (blocks, K, C): the block's sum of da[t, c] x~[t -
// (K - 1) + j, c].
struct InputGradBody {
  ConvProblem p;
  const float* da;
  float* dx;
  float* partial;
  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t x, int64_t yb, int64_t) const {
    const int64_t ch = p.channels, taps = p.taps;
    for (int64_t c = yb * kBlockThreads + b.tid(); c < (yb + 1) * kBlockThreads && c < ch;
         c += b.threads())
      for (int64_t j = 0; j < taps; ++j) partial[(x * taps + j) * ch + c] = 0.0f;
    ForEachOwned(b, p, x, yb, [&](int64_t t, int64_t c) {
      const int64_t n = p.DocOf(t);
      float sum = 0.0f;
      for (int64_t j = 0; j < taps; ++j) {
        const int64_t reader = t + (taps - 1) - j;
        if (reader < p.cu[n + 1]) sum += p.wt[j * ch + c] * da[reader * ch + c];
        partial[(x * taps + j) * ch + c] += da[t * ch + c] * p.Source(n, t - (taps - 1) + j, c);
      }
      dx[t * ch + c] = sum;
    });
  }
};

// dwindow[n, q, c] for the window position q, i.e. x~[s - (K - 1) + q]:
// the sum over the document's first tokens that read it; 0 for an empty
// document.
struct WindowGradBody {
  ConvProblem p;
  const float* da;
  float* dwindow;  // (N, K - 1, C)
  template <class Block>
  BALLAST_HD_INLINE void operator()(const Block& b, int64_t n, int64_t yb, int64_t) const {
    const int64_t ch = p.channels, taps = p.taps;
    for (int64_t c = yb * kBlockThreads + b.tid(); c < (yb + 1) * kBlockThreads && c < ch;
         c += b.threads()) {
      for (int64_t q = 0; q < taps - 1; ++q) {
        const int64_t i = p.cu[n] - (taps - 1) + q;
        float sum = 0.0f;
        for (int64_t j = 0; j < taps; ++j) {
          const int64_t reader = i + (taps - 1) - j;
          if (reader >= p.cu[n] && reader < p.cu[n + 1])
            sum += p.wt[j * ch + c] * da[reader * ch + c];
        }
        dwindow[(n * (taps - 1) + q) * ch + c] = sum;
      }
    }
  }
};

// ---------------------------------------------------------------------------
// The passes, for any launcher (kernels/cuda/block_program.h).
// ---------------------------------------------------------------------------

struct ConvTensors {
  ConvProblem p;
  at::Tensor x, wt, window, cu;  // what p points into
};

inline ConvTensors MakeConv(const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& cu_seqlens, const at::Tensor& initial_window) {
  ConvTensors t;
  t.x = x.to(at::kFloat).contiguous();
  t.wt = weight.to(at::kFloat).t().contiguous();
  if (initial_window.defined())
    t.window = initial_window.to(at::kFloat).transpose(1, 2).contiguous();
  t.cu = cu_seqlens.contiguous().clone().to(x.device());
  t.p = {t.x.const_data_ptr<float>(),
         t.wt.const_data_ptr<float>(),
         t.window.defined() ? t.window.const_data_ptr<float>() : nullptr,
         t.cu.const_data_ptr<int64_t>(),
         x.size(0),
         x.size(1),
         weight.size(1),
         cu_seqlens.numel() - 1};
  return t;
}

// causal_conv1d_silu_cpu_forward's contract (kernels/cpu/causal_conv1d_cpu.h).
template <class Launch>
at::Tensor ForwardPass(const Launch& launch, const at::Tensor& x, const at::Tensor& weight,
                       const at::Tensor& cu_seqlens, const at::Tensor& initial_window) {
  const ConvTensors t = MakeConv(x, weight, cu_seqlens, initial_window);
  at::Tensor y = at::empty({t.p.tokens, t.p.channels}, t.x.options());
  launch(t.p.TokenGrid(), 0, ForwardBody{t.p, y.mutable_data_ptr<float>()});
  return y.to(x.scalar_type());
}

// causal_conv1d_silu_cpu_backward's contract.
template <class Launch>
CausalConv1dGrads BackwardPass(const Launch& launch, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& cu_seqlens, const at::Tensor& initial_window,
                               const at::Tensor& dy) {
  const ConvTensors t = MakeConv(x, weight, cu_seqlens, initial_window);
  const ConvProblem& p = t.p;
  const at::Tensor dyf = dy.to(at::kFloat).contiguous();
  const Grid grid = p.TokenGrid();
  at::Tensor da = at::empty({p.tokens, p.channels}, t.x.options());
  launch(grid, 0, ActivationGradBody{p, dyf.const_data_ptr<float>(), da.mutable_data_ptr<float>()});
  at::Tensor dx = at::empty({p.tokens, p.channels}, t.x.options());
  at::Tensor partial = at::empty({grid.x, p.taps, p.channels}, t.x.options());
  launch(grid, 0,
         InputGradBody{p, da.const_data_ptr<float>(), dx.mutable_data_ptr<float>(),
                       partial.mutable_data_ptr<float>()});
  CausalConv1dGrads grads;
  if (t.window.defined()) {
    at::Tensor dwin = at::empty({p.docs, p.taps - 1, p.channels}, t.x.options());
    launch(Grid{p.docs, grid.y, 1}, 0,
           WindowGradBody{p, da.const_data_ptr<float>(), dwin.mutable_data_ptr<float>()});
    grads.d_window = dwin.transpose(1, 2).contiguous().to(initial_window.scalar_type());
  }
  grads.d_x = dx.to(x.scalar_type());
  grads.d_weight = partial.sum(0).t().contiguous().to(weight.scalar_type());
  return grads;
}

}  // namespace ballast::kernels::conv_blocks

#endif  // BALLAST_KERNELS_CUDA_CAUSAL_CONV1D_BLOCKS_H_
