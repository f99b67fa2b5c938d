// The float64 reference for linear_cross_entropy, shared by the CPU and CUDA
// kernel tests: F::cross_entropy on the full (T, V) logits, as plain as the
// math. Test-only; it materialises [T, V] on purpose. Beside it, what both
// tests use to run the kernel and to compare: RunKernel, ExpectClose and
// RandomTargets.
#ifndef BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "kernels/loss.h"

namespace ballast::kernels::cross_entropy_reference {

inline constexpr int64_t kIgnore = -100;

struct Result {
  at::Tensor sum;       // scalar, float64
  at::Tensor d_hidden;  // (T, H), float64
  at::Tensor d_weight;  // (V, H), float64
};

// sum_t [target_t != ignore] * w_t * (cross_entropy_t + z_loss * lse_t^2) on
// the full (T, V) logits in float64, on the inputs' device, with the gradients
// of upstream * sum by autograd.
inline Result Reference(const at::Tensor& hidden, const at::Tensor& weight,
                        const at::Tensor& targets, const std::optional<at::Tensor>& token_weights,
                        double z_loss, double upstream = 1.0) {
  namespace F = torch::nn::functional;
  at::Tensor h = hidden.detach().to(torch::kDouble).requires_grad_();
  at::Tensor w = weight.detach().to(torch::kDouble).requires_grad_();
  at::Tensor logits = h.mm(w.t());
  at::Tensor per_token = F::cross_entropy(
      logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(kIgnore));
  at::Tensor counted = targets.ne(kIgnore).to(torch::kDouble);
  per_token = per_token + z_loss * logits.logsumexp(1).square() * counted;
  if (token_weights) per_token = per_token * token_weights->to(torch::kDouble);
  at::Tensor sum = per_token.sum();
  (sum * upstream).backward();
  return {sum.detach(), h.grad(), w.grad()};
}

// Runs the kernel through the dispatch layer on leaves that require grad,
// expects its count to be the targets that are not ignored, and
// backpropagates upstream * sum; the result in float64 on the inputs' device.
inline Result RunKernel(const at::Tensor& hidden, const at::Tensor& weight,
                        const at::Tensor& targets, const std::optional<at::Tensor>& token_weights,
                        double z_loss, double upstream = 1.0) {
  at::Tensor h = hidden.detach().clone().requires_grad_();
  at::Tensor w = weight.detach().clone().requires_grad_();
  LossSum out = linear_cross_entropy(h, w, targets, token_weights, kIgnore, z_loss);
  EXPECT_EQ(out.count.item<int64_t>(), targets.ne(kIgnore).sum().item<int64_t>());
  (out.sum * upstream).backward();
  return {out.sum.detach().to(torch::kDouble), h.grad().to(torch::kDouble),
          w.grad().to(torch::kDouble)};
}

// max |actual - expected| <= rtol * max |expected|: a norm-wise bound, since
// entries of a gradient near zero carry the absolute error of their row.
inline void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                        const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_TRUE(torch::isfinite(actual).all().item<bool>()) << what << " has a non-finite value";
  const double err = (actual - expected).abs().max().item<double>();
  const double scale = expected.abs().max().item<double>();
  EXPECT_LE(err, rtol * scale) << what << ": max abs error " << err << ", max |expected| " << scale;
}

// `tokens` targets drawn uniformly from [0, vocab) on `device`, every
// every_nth_ignored-th of them (from the first) set to kIgnore; none when it
// is 0.
inline at::Tensor RandomTargets(int64_t tokens, int64_t vocab, int64_t every_nth_ignored,
                                torch::Device device = torch::kCPU) {
  const auto opts = torch::TensorOptions().device(device).dtype(torch::kLong);
  at::Tensor targets = torch::randint(vocab, {tokens}, opts);
  if (every_nth_ignored > 0)
    targets.index_put_({torch::arange(0, tokens, every_nth_ignored, opts)}, kIgnore);
  return targets;
}

// The review's fp16 overflow trigger: T = 8192 tokens of hidden = 20 + randn
// (H = 64), every target 0, the loss scaled by 1 / T. The unit gradient of
// weight[0] sums about -20 over every token (-1.6e5, past fp16's 65504);
// scaled first, it is about -20. A small weight keeps softmax_0 near 1 / V.
// RunKernel runs it on `device`; the gradients must be finite, match the
// float64 reference within rtol of their largest entry, and d_weight[0] must
// average -20 +- 1. d_hidden is ~3e-6 here, in fp16's subnormal range,
// where values are spaced 2^-24 (6e-8) apart: fp16 gets that much more.
inline void ExpectOverflowTriggerScalesBeforeRounding(torch::Dtype dtype, torch::Device device,
                                                      double rtol) {
  constexpr int64_t kTokens = 8192, kHidden = 64, kVocab = 256;
  const auto opts = torch::TensorOptions().device(device);
  const at::Tensor hidden = (20 + torch::randn({kTokens, kHidden}, opts)).to(dtype);
  const at::Tensor weight = (0.01 * torch::randn({kVocab, kHidden}, opts)).to(dtype);
  const at::Tensor targets = torch::zeros({kTokens}, opts.dtype(torch::kLong));
  const double upstream = 1.0 / kTokens;
  const Result got = RunKernel(hidden, weight, targets, std::nullopt, 0.0, upstream);
  const Result want = Reference(hidden, weight, targets, std::nullopt, 0.0, upstream);
  const std::string what = c10::toString(dtype);
  for (const auto& [actual, expected, name] :
       {std::tuple{got.d_weight, want.d_weight, "d_weight"},
        std::tuple{got.d_hidden, want.d_hidden, "d_hidden"}}) {
    ASSERT_TRUE(torch::isfinite(actual).all().item<bool>()) << what << " " << name;
    const double err = (actual.cpu() - expected.cpu()).abs().max().item<double>();
    const double atol = dtype == torch::kHalf ? std::ldexp(1.0, -24) : 0.0;
    EXPECT_LE(err, rtol * expected.abs().max().item<double>() + atol) << what << " " << name;
  }
  EXPECT_NEAR(got.d_weight[0].mean().item<double>(), -20.0, 1.0) << what;
}

}  // namespace ballast::kernels::cross_entropy_reference

#endif  // BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_
