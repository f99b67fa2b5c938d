// The float64 reference for linear_cross_entropy, shared by the CPU and CUDA
// kernel tests: F::cross_entropy on the full (T, V) logits, as plain as the
// math. Test-only; it materialises [T, V] on purpose.
#ifndef BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>

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

// The review's fp16 overflow trigger: T = 8192 tokens of hidden = 20 + randn
// (H = 64), every target 0, the loss scaled by 1 / T. The unit gradient of
// weight[0] sums about -20 over every token (-1.6e5, past fp16's 65504);
// scaled first, it is about -20. A small weight keeps softmax_0 near 1 / V.
// `run(hidden, weight, targets, upstream)` runs the kernel through the
// dispatch layer and returns its Result; the gradients must be finite, match
// the float64 reference within rtol of their largest entry, and d_weight[0]
// must average -20 +- 1. d_hidden is ~3e-6 here, in fp16's subnormal range,
// where values are spaced 2^-24 (6e-8) apart: fp16 gets that much more.
using KernelRun = std::function<Result(const at::Tensor& hidden, const at::Tensor& weight,
                                       const at::Tensor& targets, double upstream)>;

inline void ExpectOverflowTriggerScalesBeforeRounding(torch::Dtype dtype, torch::Device device,
                                                      double rtol, const KernelRun& run) {
  constexpr int64_t kTokens = 8192, kHidden = 64, kVocab = 256;
  const auto opts = torch::TensorOptions().device(device);
  const at::Tensor hidden = (20 + torch::randn({kTokens, kHidden}, opts)).to(dtype);
  const at::Tensor weight = (0.01 * torch::randn({kVocab, kHidden}, opts)).to(dtype);
  const at::Tensor targets = torch::zeros({kTokens}, opts.dtype(torch::kLong));
  const double upstream = 1.0 / kTokens;
  const Result got = run(hidden, weight, targets, upstream);
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
