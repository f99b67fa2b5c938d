// The float64 attention reference shared by the CPU and CUDA kernel tests: the
// structural masks written out as dense (n, n) matrices straight from their
// definitions in kernels/attention.h, and softmax attention as plain ATen ops;
// beside it the inputs, runs and comparisons both tests make.
// Test-only; a dense mask is fine here because documents are small.
#ifndef BALLAST_TESTS_UNIT_KERNELS_ATTENTION_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_ATTENTION_REFERENCE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/attention_cpu.h"

namespace ballast::kernels::attention_reference {

inline at::Tensor Cu(const std::vector<int64_t>& lengths) {
  std::vector<int64_t> cu = {0};
  for (int64_t n : lengths) cu.push_back(cu.back() + n);
  return torch::tensor(cu, torch::kLong);
}

inline int64_t Total(const std::vector<int64_t>& lengths) {
  return std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
}

inline AttentionMask Causal(const std::vector<int64_t>& lengths, int64_t window = 0) {
  AttentionMask mask;
  mask.kind = MaskKind::kCausal;
  mask.cu_seqlens = Cu(lengths);
  mask.window = window;
  return mask;
}

inline AttentionMask BlockDiffusion(const std::vector<int64_t>& lengths, int64_t block_size) {
  AttentionMask mask;
  mask.kind = MaskKind::kBlockDiffusion;
  mask.cu_seqlens = Cu(lengths);
  mask.block_size = block_size;
  return mask;
}

// visible[i][j] for one document of n tokens, straight from the definitions in
// kernels/attention.h.
inline torch::Tensor VisibleMatrix(const AttentionMask& mask, int64_t n) {
  torch::Tensor visible = torch::zeros({n, n}, torch::kBool);
  auto a = visible.accessor<bool, 2>();
  const int64_t half = n / 2;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (mask.kind == MaskKind::kCausal) {
        a[i][j] = j <= i && (mask.window == 0 || i - j < mask.window);
        continue;
      }
      const bool noisy_i = i < half;
      const bool noisy_j = j < half;
      const int64_t block_i = (noisy_i ? i : i - half) / mask.block_size;
      const int64_t block_j = (noisy_j ? j : j - half) / mask.block_size;
      if (noisy_i && noisy_j) a[i][j] = block_i == block_j;
      if (noisy_i && !noisy_j) a[i][j] = block_j < block_i;
      if (!noisy_i && !noisy_j) a[i][j] = block_j <= block_i;
    }
  }
  return visible;
}

// softmax(q k^T * scale, masked) v per document and head, in the inputs'
// dtype (float64 in the tests); keeps the autograd graph. visible(begin, n)
// gives a document's (n, n) mask. Rows that see nothing give 0.
inline torch::Tensor Reference(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const std::vector<int64_t>& cu,
                               const std::function<torch::Tensor(int64_t, int64_t)>& visible,
                               double scale) {
  const int64_t group = q.size(1) / k.size(1);
  std::vector<torch::Tensor> outs;
  for (size_t d = 0; d + 1 < cu.size(); ++d) {
    const int64_t begin = cu[d];
    const int64_t n = cu[d + 1] - begin;
    if (n == 0) continue;
    auto qd = q.narrow(0, begin, n).transpose(0, 1);                              // (Hq, n, D)
    auto kd = k.narrow(0, begin, n).transpose(0, 1).repeat_interleave(group, 0);  // (Hq, n, D)
    auto vd = v.narrow(0, begin, n).transpose(0, 1).repeat_interleave(group, 0);  // (Hq, n, D)
    auto scores = torch::matmul(qd, kd.transpose(1, 2)) * scale;                  // (Hq, n, n)
    scores = scores.masked_fill(visible(begin, n).logical_not(),
                                -std::numeric_limits<double>::infinity());
    auto probs = torch::softmax(scores, -1).nan_to_num(0.0);   // rows that see nothing: 0
    outs.push_back(torch::matmul(probs, vd).transpose(0, 1));  // (n, Hq, D)
  }
  return outs.empty() ? torch::zeros_like(q) : torch::cat(outs, 0);
}

// The same with the documents and mask of an AttentionMask.
inline torch::Tensor Reference(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const AttentionMask& mask, double scale) {
  const at::Tensor cu_t = mask.cu_seqlens.contiguous();
  const std::vector<int64_t> cu(cu_t.data_ptr<int64_t>(), cu_t.data_ptr<int64_t>() + cu_t.numel());
  return Reference(
      q, k, v, cu, [&](int64_t, int64_t n) { return VisibleMatrix(mask, n); }, scale);
}

// Causal attention of one document for the listed query rows only, each row
// against exactly its keys [0, i], in the inputs' dtype and device; keeps
// autograd. Cheap enough to check single rows of very long sequences.
inline torch::Tensor CausalRowsReference(const torch::Tensor& q, const torch::Tensor& k,
                                         const torch::Tensor& v, const std::vector<int64_t>& rows,
                                         double scale) {
  const int64_t group = q.size(1) / k.size(1);
  std::vector<torch::Tensor> outs;
  for (int64_t i : rows) {
    std::vector<torch::Tensor> heads;
    for (int64_t h = 0; h < q.size(1); ++h) {
      auto keys = k.narrow(0, 0, i + 1).select(1, h / group);    // (i + 1, D)
      auto values = v.narrow(0, 0, i + 1).select(1, h / group);  // (i + 1, D)
      auto probs = torch::softmax(torch::mv(keys, q[i][h]) * scale, 0);
      heads.push_back(torch::mv(values.t(), probs));
    }
    outs.push_back(torch::stack(heads));  // (Hq, D)
  }
  return torch::stack(outs);  // (rows, Hq, D)
}

// A hand-built IntervalMask with rows that see no key, which no structural
// mask produces. Segment [0, block_m + 6): row i sees [0, i] except rows 3 and
// block_m + 2 (the second query tile), which see nothing. The last 10 tokens
// form a segment where nobody sees anything, so its tile has no work at all.
struct BlindRows {
  IntervalMask mask;
  torch::Tensor visible;  // (tokens, tokens), the same mask written out
  int64_t tokens = 0;
};

inline BlindRows BlindRowsMask(int64_t block_m) {
  const int64_t seen = block_m + 6;
  const int64_t late = block_m + 2;
  BlindRows r;
  r.tokens = seen + 10;
  r.mask.segments = torch::tensor(std::vector<int64_t>{0, seen, r.tokens}, torch::kLong);
  r.mask.key_ranges = torch::zeros({r.tokens, 4}, torch::kLong);
  r.mask.query_ranges = torch::zeros({r.tokens, 4}, torch::kLong);
  r.visible = torch::zeros({r.tokens, r.tokens}, torch::kBool);
  auto kr = r.mask.key_ranges.accessor<int64_t, 2>();
  auto qr = r.mask.query_ranges.accessor<int64_t, 2>();
  for (int64_t i = 0; i < seen; ++i) {
    if (i == 3 || i == late) continue;
    kr[i][1] = i + 1;
    r.visible.narrow(0, i, 1).narrow(1, 0, i + 1).fill_(true);
  }
  for (int64_t j = 0; j < seen; ++j) {
    qr[j][0] = j;
    qr[j][1] = seen;
  }
  return r;
}

struct Grads {
  torch::Tensor out, dq, dk, dv;
};

struct Inputs {
  torch::Tensor q, k, v, grad_out;  // on CPU, in the test's dtype
};

// q and grad_out (tokens, hq, d), k and v (tokens, hkv, d): N(0, 1) drawn in
// fp32 from the global generator, then rounded to dtype.
inline Inputs RandomInputs(int64_t tokens, int64_t hq, int64_t hkv, int64_t d, torch::Dtype dtype) {
  return {torch::randn({tokens, hq, d}).to(dtype), torch::randn({tokens, hkv, d}).to(dtype),
          torch::randn({tokens, hkv, d}).to(dtype), torch::randn({tokens, hq, d}).to(dtype)};
}

using AttentionFn =
    std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

// Output and gradients of sum(out * grad_out) through fn, on copies of q, k, v
// moved to `device`; the results come back on CPU.
inline Grads RunWithGrads(const AttentionFn& fn, const torch::Tensor& q, const torch::Tensor& k,
                          const torch::Tensor& v, const torch::Tensor& grad_out,
                          const torch::Device& device = torch::kCPU) {
  auto qq = q.detach().to(device).clone().requires_grad_(true);
  auto kk = k.detach().to(device).clone().requires_grad_(true);
  auto vv = v.detach().to(device).clone().requires_grad_(true);
  auto out = fn(qq, kk, vv);
  (out.to(torch::kDouble) * grad_out.to(device).to(torch::kDouble)).sum().backward();
  return {out.detach().cpu(), qq.grad().cpu(), kk.grad().cpu(), vv.grad().cpu()};
}

// max |actual - expected| / max(max |expected|, 1). Gradients are sums of
// terms of both signs, so an error is measured against the tensor's scale,
// not per element; inputs are ~N(0, 1), so below 1 the bound is absolute
// (dQ under a window of 1 is 0 in exact arithmetic and ~1e-8 in fp32).
inline double RelativeError(const torch::Tensor& actual, const torch::Tensor& expected) {
  const auto a = actual.to(torch::kDouble);
  const auto e = expected.to(torch::kDouble);
  const double scale = std::max(e.abs().max().item<double>(), 1.0);
  return (a - e).abs().max().item<double>() / scale;
}

inline void ExpectCloseMaxNorm(const Grads& got, const Grads& want, double tol,
                               const std::string& what) {
  EXPECT_TRUE(torch::isfinite(got.out).all().item<bool>()) << what;
  EXPECT_LE(RelativeError(got.out, want.out), tol) << what << " out";
  EXPECT_LE(RelativeError(got.dq, want.dq), tol) << what << " dq";
  EXPECT_LE(RelativeError(got.dk, want.dk), tol) << what << " dk";
  EXPECT_LE(RelativeError(got.dv, want.dv), tol) << what << " dv";
}

// Expects call() to throw a c10::Error whose message contains `needle`.
inline void ExpectErrorMentions(const std::function<void()>& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace ballast::kernels::attention_reference

#endif  // BALLAST_TESTS_UNIT_KERNELS_ATTENTION_REFERENCE_H_
