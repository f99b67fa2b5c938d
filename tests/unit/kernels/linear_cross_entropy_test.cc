#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/linear_cross_entropy_cpu.h"
#include "kernels/loss.h"
#include "tests/unit/kernels/linear_cross_entropy_reference.h"

namespace ballast::kernels {
namespace {

namespace F = torch::nn::functional;

using cross_entropy_reference::ExpectClose;
using cross_entropy_reference::kIgnore;
using cross_entropy_reference::RandomTargets;
using cross_entropy_reference::Reference;
using cross_entropy_reference::Result;
using cross_entropy_reference::RunKernel;

at::Tensor Targets(std::vector<int64_t> values) { return torch::tensor(values, torch::kLong); }

// fp32 inputs, fp32 compute: the logits carry the rounding of an H-term fp32
// dot product and the log-sum-exp that of a V-term fp32 sum, a few 1e-7
// relative each; 2e-5 leaves an order of magnitude of margin.
constexpr double kFp32Rtol = 2e-5;

TEST(LinearCrossEntropy, MatchesPlainCrossEntropyWithoutWeightsOrZLoss) {
  torch::manual_seed(0);
  at::Tensor hidden = torch::randn({37, 32});
  at::Tensor weight = torch::randn({100, 32}) * 0.3;
  at::Tensor targets = RandomTargets(37, 100, 5);
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 0.0);
  at::Tensor want =
      F::cross_entropy(hidden.to(torch::kDouble).mm(weight.to(torch::kDouble).t()), targets,
                       F::CrossEntropyFuncOptions().reduction(torch::kSum).ignore_index(kIgnore));
  ExpectClose(got.sum, want, kFp32Rtol, "sum");
  Result ref = Reference(hidden, weight, targets, std::nullopt, 0.0);
  ExpectClose(got.d_hidden, ref.d_hidden, kFp32Rtol, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, kFp32Rtol, "d_weight");
}

TEST(LinearCrossEntropy, ACallerKnownCountGivesTheSameLossAndIsChecked) {
  torch::manual_seed(1);
  at::Tensor hidden = torch::randn({29, 16});
  at::Tensor weight = torch::randn({50, 16}) * 0.3;
  at::Tensor targets = RandomTargets(29, 50, 4);
  const int64_t counted = targets.ne(kIgnore).sum().item<int64_t>();
  LossSum plain = linear_cross_entropy(hidden, weight, targets);
  LossSum told = linear_cross_entropy(hidden, weight, targets, std::nullopt, kIgnore, 0.0, counted);
  EXPECT_EQ(told.sum.item<float>(), plain.sum.item<float>());
  EXPECT_EQ(told.count.item<int64_t>(), counted);
  try {
    linear_cross_entropy(hidden, weight, targets, std::nullopt, kIgnore, 0.0, counted + 1);
    ADD_FAILURE() << "a wrong count was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("counted = "), std::string::npos);
  }
}

TEST(LinearCrossEntropy, MatchesFloat64ReferenceWithIgnoreWeightsAndZLoss) {
  torch::manual_seed(1);
  at::Tensor hidden = torch::randn({37, 32});
  at::Tensor weight = torch::randn({100, 32}) * 0.3;
  at::Tensor targets = RandomTargets(37, 100, 4);
  at::Tensor token_weights = torch::rand({37}) * 2;
  constexpr double kZLoss = 1e-2;
  constexpr double kUpstream = 0.37;
  Result got = RunKernel(hidden, weight, targets, token_weights, kZLoss, kUpstream);
  Result ref = Reference(hidden, weight, targets, token_weights, kZLoss, kUpstream);
  ExpectClose(got.sum, ref.sum, kFp32Rtol, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, kFp32Rtol, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, kFp32Rtol, "d_weight");
}

TEST(LinearCrossEntropy, MatchesFloat64ReferenceAtQwenVocab) {
  torch::manual_seed(2);
  constexpr int64_t kVocab = 151936;
  at::Tensor hidden = torch::randn({16, 64});
  at::Tensor weight = torch::randn({kVocab, 64}) * 0.2;
  at::Tensor targets = RandomTargets(16, kVocab, 3);
  at::Tensor token_weights = torch::rand({16}) + 0.5;
  Result got = RunKernel(hidden, weight, targets, token_weights, 1e-4);
  Result ref = Reference(hidden, weight, targets, token_weights, 1e-4);
  ExpectClose(got.sum, ref.sum, kFp32Rtol, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, kFp32Rtol, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, kFp32Rtol, "d_weight");
}

TEST(LinearCrossEntropy, Bf16InputsMatchReferenceOnTheRoundedValues) {
  torch::manual_seed(3);
  at::Tensor hidden = torch::randn({37, 32}).to(torch::kBFloat16);
  at::Tensor weight = (torch::randn({100, 32}) * 0.3).to(torch::kBFloat16);
  at::Tensor targets = RandomTargets(37, 100, 4);
  LossSum out = linear_cross_entropy(hidden, weight, targets);
  EXPECT_EQ(out.sum.scalar_type(), torch::kFloat);
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 1e-3);
  Result ref = Reference(hidden, weight, targets, std::nullopt, 1e-3);
  // The loss is computed in fp32 from exactly representable inputs, so it has
  // fp32 accuracy; the gradients are rounded to bf16 (8 mantissa bits).
  ExpectClose(got.sum, ref.sum, kFp32Rtol, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, 1e-2, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, 1e-2, "d_weight");
}

// The gradient is scaled by the upstream factor in fp32 and rounded to bf16
// once, so every element is within one bf16 rounding (2^-9 relative, 2^-8
// with margin) of the exact value; rounding the unit gradient or the factor
// to bf16 first would add up to two more.
TEST(LinearCrossEntropy, Bf16GradientsAreRoundedOnceAfterScaling) {
  torch::manual_seed(8);
  at::Tensor hidden = torch::randn({40, 16}).to(torch::kBFloat16);
  at::Tensor weight = torch::randn({50, 16}).to(torch::kBFloat16);
  at::Tensor targets = RandomTargets(40, 50, 7);
  constexpr double kUpstream = 1.0 / 3.0;  // not a bf16 value
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 0.0, kUpstream);
  Result ref = Reference(hidden, weight, targets, std::nullopt, 0.0);
  for (auto [actual, exact, what] :
       {std::make_tuple(got.d_hidden, ref.d_hidden * kUpstream, "d_hidden"),
        std::make_tuple(got.d_weight, ref.d_weight * kUpstream, "d_weight")}) {
    const at::Tensor excess = (actual - exact).abs() - std::ldexp(1.0, -8) * exact.abs() - 1e-30;
    EXPECT_LE(excess.max().item<double>(), 0.0) << what;
  }
}

// Through the dispatch layer: the upstream 1 / T is applied in fp32 before
// the gradient is rounded to fp16 / bf16, so the summed unit gradient (about
// -1.6e5) never meets fp16's 65504. d_weight[0] is about -20 per column;
// one rounding of the input dtype (2^-11 fp16, 2^-8 bf16) plus fp32 sums
// over 8192 tokens, so 2e-3 / 1e-2 norm-wise.
TEST(LinearCrossEntropy, Fp16AndBf16GradientsScaleBeforeRoundingSoTheyDoNotOverflow) {
  torch::manual_seed(21);
  for (auto [dtype, rtol] :
       {std::pair<torch::Dtype, double>{torch::kHalf, 2e-3}, {torch::kBFloat16, 1e-2}}) {
    cross_entropy_reference::ExpectOverflowTriggerScalesBeforeRounding(dtype, torch::kCPU, rtol);
  }
}

TEST(LinearCrossEntropy, GradientsMatchFiniteDifferencesInFloat64) {
  torch::manual_seed(4);
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  at::Tensor hidden = torch::randn({5, 3}, f64);
  at::Tensor weight = torch::randn({7, 3}, f64);
  at::Tensor targets = Targets({3, kIgnore, 0, 6, 3});
  at::Tensor token_weights = torch::tensor({0.5f, 2.0f, 1.0f, 1.5f, 0.25f});
  constexpr double kZLoss = 0.1;
  auto loss = [&](const at::Tensor& h, const at::Tensor& w) {
    return linear_cross_entropy(h, w, targets, token_weights, kIgnore, kZLoss).sum.item<double>();
  };
  Result got = RunKernel(hidden, weight, targets, token_weights, kZLoss);
  ASSERT_EQ(got.sum.scalar_type(), torch::kDouble);
  // Central differences: truncation error ~eps^2 and cancellation ~1e-16/eps,
  // both far below the 1e-7 tolerance at eps = 1e-5.
  constexpr double kEps = 1e-5;
  for (at::Tensor* x : {&hidden, &weight}) {
    at::Tensor numeric = torch::zeros_like(*x);
    for (int64_t i = 0; i < x->numel(); ++i) {
      at::Tensor plus = x->clone();
      at::Tensor minus = x->clone();
      plus.view(-1)[i] += kEps;
      minus.view(-1)[i] -= kEps;
      const double fp = x == &hidden ? loss(plus, weight) : loss(hidden, plus);
      const double fm = x == &hidden ? loss(minus, weight) : loss(hidden, minus);
      numeric.view(-1)[i] = (fp - fm) / (2 * kEps);
    }
    const at::Tensor& analytic = x == &hidden ? got.d_hidden : got.d_weight;
    EXPECT_TRUE(torch::allclose(analytic, numeric, 1e-7, 1e-7))
        << (x == &hidden ? "d_hidden" : "d_weight") << "\nanalytic\n"
        << analytic << "\nnumeric\n"
        << numeric;
  }
  EXPECT_TRUE(got.d_hidden[1].eq(0).all().item<bool>()) << "ignored row must get zero gradient";
}

TEST(LinearCrossEntropy, LogitsOfTenThousandGiveFiniteLossAndGradients) {
  torch::manual_seed(5);
  at::Tensor hidden = torch::randn({24, 16});
  at::Tensor weight = torch::randn({300, 16});
  // Scale hidden so that the largest |logit| is exactly 1e4.
  hidden = hidden * (1e4 / hidden.mm(weight.t()).abs().max());
  at::Tensor targets = RandomTargets(24, 300, 6);
  for (double z_loss : {0.0, 1e-4}) {
    Result got = RunKernel(hidden, weight, targets, std::nullopt, z_loss);
    Result ref = Reference(hidden, weight, targets, std::nullopt, z_loss);
    ASSERT_TRUE(std::isfinite(got.sum.item<double>())) << "z_loss " << z_loss;
    // Per-token losses are differences of ~1e4 logits, so the fp32 error is
    // relative to 1e4 rather than to the loss: 1e-4 of the sum is ample.
    ExpectClose(got.sum, ref.sum, 1e-4, "sum");
    ExpectClose(got.d_hidden, ref.d_hidden, 1e-4, "d_hidden");
    ExpectClose(got.d_weight, ref.d_weight, 1e-4, "d_weight");
  }
}

TEST(LinearCrossEntropy, CountExcludesIgnoredTokensAndIgnoresWeights) {
  at::Tensor hidden = torch::randn({6, 4});
  at::Tensor weight = torch::randn({9, 4});
  at::Tensor targets = Targets({1, kIgnore, 8, kIgnore, 0, 2});
  LossSum plain = linear_cross_entropy(hidden, weight, targets);
  LossSum weighted = linear_cross_entropy(hidden, weight, targets, torch::full({6}, 3.0f));
  EXPECT_EQ(plain.count.scalar_type(), torch::kLong);
  EXPECT_EQ(plain.count.dim(), 0);
  EXPECT_EQ(plain.count.item<int64_t>(), 4);
  EXPECT_EQ(weighted.count.item<int64_t>(), 4);
  EXPECT_NEAR(weighted.sum.item<float>(), 3 * plain.sum.item<float>(),
              1e-6 * std::abs(weighted.sum.item<float>()));
}

TEST(LinearCrossEntropy, AllIgnoredGivesZeroSumZeroCountAndZeroGradients) {
  at::Tensor hidden = torch::randn({5, 4}).requires_grad_();
  at::Tensor weight = torch::randn({9, 4}).requires_grad_();
  at::Tensor targets = torch::full({5}, kIgnore, torch::kLong);
  LossSum out = linear_cross_entropy(hidden, weight, targets, torch::ones({5}), kIgnore, 1e-3);
  EXPECT_EQ(out.count.item<int64_t>(), 0);
  EXPECT_EQ(out.sum.item<float>(), 0.f);
  out.sum.backward();
  EXPECT_TRUE(hidden.grad().eq(0).all().item<bool>()) << hidden.grad();
  EXPECT_TRUE(weight.grad().eq(0).all().item<bool>()) << weight.grad();
}

TEST(LinearCrossEntropy, FrozenWeightGetsNoGradient) {
  at::Tensor hidden = torch::randn({6, 4}).requires_grad_();
  at::Tensor weight = torch::randn({9, 4});
  at::Tensor targets = Targets({1, kIgnore, 8, 3, 0, 2});
  linear_cross_entropy(hidden, weight, targets).sum.backward();
  EXPECT_FALSE(weight.grad().defined());
  Result ref = Reference(hidden, weight, targets, std::nullopt, 0.0);
  ExpectClose(hidden.grad().to(torch::kDouble), ref.d_hidden, kFp32Rtol, "d_hidden");
}

TEST(LinearCrossEntropy, MatchesReferenceAcrossBlockAndTileBoundaries) {
  torch::manual_seed(6);
  // Counted rows: one more than a logits block, then a ragged last block.
  // Vocab: ragged past one upcast tile, exactly one tile, a single entry; the
  // tiles only exist for bf16 and fp16, which upcast weight a tile at a time.
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t vocab : {kLceChunkVocab + 13, kLceChunkVocab, int64_t{1}}) {
      const int64_t block_rows = lce_block_rows(vocab, sizeof(float));
      const int64_t tokens = std::min(block_rows, int64_t{600}) + 37;
      at::Tensor hidden = torch::randn({tokens, 8}).to(dtype);
      at::Tensor weight = (torch::randn({vocab, 8}) * 0.5).to(dtype);
      at::Tensor targets = RandomTargets(tokens, vocab, 30);
      at::Tensor token_weights = torch::rand({tokens});
      // With one entry the softmax is 1 and the whole gradient is the z-loss
      // term, 2 z_loss lse w, made as (1 + 2 z_loss lse) w - w: fp32 loses a
      // factor 1 / (2 z_loss |lse|) to that cancellation, about 100 at 1e-3.
      const double z_loss = vocab == 1 ? 0.1 : 1e-3;
      Result got = RunKernel(hidden, weight, targets, token_weights, z_loss);
      // The reference sees the same rounded inputs, so only the fp32 compute differs.
      Result ref = Reference(hidden, weight, targets, token_weights, z_loss);
      // bf16 gradients are rounded to bf16 on the way out: 2^-8 relative.
      const double rtol = dtype == at::kFloat ? kFp32Rtol : 1e-2;
      const std::string where = std::string(c10::toString(dtype)) +
                                ", V = " + std::to_string(vocab) +
                                ", block rows = " + std::to_string(block_rows);
      ExpectClose(got.sum, ref.sum, kFp32Rtol, "sum, " + where);
      ExpectClose(got.d_hidden, ref.d_hidden, rtol, "d_hidden, " + where);
      ExpectClose(got.d_weight, ref.d_weight, rtol, "d_weight, " + where);
    }
  }
}

TEST(LinearCrossEntropy, BlocksHoldWholeRowsWithinTheByteBudget) {
  for (int64_t vocab : {int64_t{1}, int64_t{4096}, int64_t{151936}, int64_t{1} << 24}) {
    const int64_t rows = lce_block_rows(vocab, sizeof(float));
    EXPECT_GE(rows, 1) << "V = " << vocab;
    EXPECT_LE(rows, kLceMaxBlockRows) << "V = " << vocab;
    if (rows > 1) EXPECT_LE(rows * vocab * 4, kLceLogitsBlockBytes) << "V = " << vocab;
  }
}

TEST(LinearCrossEntropy, NoGradientsAreMadeUnderNoGrad) {
  at::Tensor hidden = torch::randn({6, 4}).requires_grad_();
  at::Tensor weight = torch::randn({9, 4}).requires_grad_();
  at::Tensor targets = Targets({1, kIgnore, 8, 3, 0, 2});
  const double expected = Reference(hidden, weight, targets, std::nullopt, 0.0).sum.item<double>();
  torch::NoGradGuard no_grad;
  LossSum out = linear_cross_entropy(hidden, weight, targets);
  EXPECT_FALSE(out.sum.requires_grad());
  EXPECT_NEAR(out.sum.item<double>(), expected, 1e-5 * std::abs(expected));
}

TEST(LinearCrossEntropy, SecondBackwardThroughTheSameLossIsAClearError) {
  at::Tensor hidden = torch::randn({6, 4}).requires_grad_();
  at::Tensor weight = torch::randn({9, 4});
  at::Tensor targets = Targets({1, kIgnore, 8, 3, 0, 2});
  at::Tensor sum = linear_cross_entropy(hidden, weight, targets).sum;
  sum.backward({}, /*retain_graph=*/true);
  try {
    sum.backward();
    ADD_FAILURE() << "second backward did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("backward ran twice"), std::string::npos)
        << e.what_without_backtrace();
  }
}

// Expects linear_cross_entropy to throw c10::Error whose message contains `needle`.
void ExpectError(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                 const std::optional<at::Tensor>& token_weights, const std::string& needle) {
  try {
    linear_cross_entropy(hidden, weight, targets, token_weights);
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(LinearCrossEntropy, RejectsBadInputsNamingTheArgument) {
  at::Tensor hidden = torch::randn({4, 3});
  at::Tensor weight = torch::randn({7, 3});
  at::Tensor targets = Targets({0, 6, kIgnore, 2});
  ExpectError(hidden, weight, Targets({0, 6, kIgnore, 7}), std::nullopt,
              "targets[3] = 7 is outside [0, V = 7)");
  ExpectError(hidden, weight, Targets({0, -1, 1, 2}), std::nullopt, "targets[1] = -1");
  ExpectError(hidden, torch::randn({7, 5}), targets, std::nullopt, "weight must have H = 3");
  ExpectError(hidden, weight.to(torch::kBFloat16), targets, std::nullopt,
              "weight must have hidden's dtype");
  ExpectError(hidden.to(torch::kInt), weight.to(torch::kInt), targets, std::nullopt,
              "hidden must be fp32, bf16, fp16 or fp64");
  ExpectError(hidden, weight, targets.to(torch::kInt), std::nullopt, "targets must be int64");
  ExpectError(hidden, weight, targets.narrow(0, 0, 3), std::nullopt,
              "targets must be 1-D of length T = 4");
  ExpectError(hidden.view(-1), weight, targets, std::nullopt, "hidden must be 2-D");
  ExpectError(hidden, weight.view(-1), targets, std::nullopt, "weight must be 2-D");
  ExpectError(hidden, weight, targets, torch::ones({4}, torch::kDouble),
              "token_weights must be fp32");
  ExpectError(hidden, weight, targets, torch::ones({5}), "token_weights must be 1-D of length T");
}

}  // namespace
}  // namespace ballast::kernels
