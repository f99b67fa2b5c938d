#include "kernels/reranker_loss.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

// Every test draws fresh inputs; the seed is printed with any failure.
class RerankerLossTest : public SeededTest {};

constexpr RerankerScore kScores[] = {RerankerScore::kLogSigmoid, RerankerScore::kLogitDiff};

std::string Name(RerankerScore score) {
  return score == RerankerScore::kLogSigmoid ? "logsigmoid" : "logit_diff";
}

at::Tensor Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets = {0};
  for (int64_t n : sizes) offsets.push_back(offsets.back() + n);
  return torch::tensor(offsets, torch::kLong);
}

int64_t Total(const std::vector<int64_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

// ---------------------------------------------------------------------------
// Float64 reference, as plain as the math in kernels/reranker_loss.h. It uses
// exp and log without shifts, so it needs moderate inputs: |Δ| / τ well below
// 700, where exp overflows in float64.
// ---------------------------------------------------------------------------

struct Result {
  at::Tensor sum;        // scalar, float64
  at::Tensor d_hidden;   // (N, H), float64
  at::Tensor d_yes_no;   // (2, H), float64
  double scale = 0;      // Σ |x_j| over counted candidates, or Σ L_i (see the tests)
  double max_abs_x = 0;  // max |x_j| over counted candidates, or max |Δ_i| pointwise
};

Result ListwiseReference(const at::Tensor& hidden, const at::Tensor& yes_no,
                         const std::vector<int64_t>& sizes, double tau, RerankerScore score) {
  at::Tensor h = hidden.detach().to(torch::kDouble).requires_grad_();
  at::Tensor w = yes_no.detach().to(torch::kDouble).requires_grad_();
  at::Tensor delta = h.mv(w[0]) - h.mv(w[1]);
  // log σ(Δ) = −log(1 + exp(−Δ)).
  at::Tensor s = score == RerankerScore::kLogSigmoid ? -torch::log(1 + torch::exp(-delta)) : delta;
  at::Tensor sum = torch::zeros({}, torch::kDouble);
  double scale = 0;
  double max_abs_x = 0;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    if (size >= 2) {
      at::Tensor x = s.narrow(0, begin, size) / tau;
      sum = sum - x[0] + torch::log(torch::exp(x).sum());
      scale += x.abs().sum().item<double>();
      max_abs_x = std::max(max_abs_x, x.abs().max().item<double>());
    }
    begin += size;
  }
  sum.backward();
  return {sum.detach(), h.grad(), w.grad(), scale, max_abs_x};
}

Result PointwiseReference(const at::Tensor& hidden, const at::Tensor& yes_no,
                          const at::Tensor& labels) {
  at::Tensor h = hidden.detach().to(torch::kDouble).requires_grad_();
  at::Tensor w = yes_no.detach().to(torch::kDouble).requires_grad_();
  at::Tensor delta = h.mv(w[0]) - h.mv(w[1]);
  at::Tensor p = 1 / (1 + torch::exp(-delta));
  at::Tensor y = labels.to(torch::kDouble);
  at::Tensor sum = -(y * torch::log(p) + (1 - y) * torch::log(1 - p)).sum();
  sum.backward();
  return {sum.detach(), h.grad(), w.grad(), sum.item<double>(), delta.abs().max().item<double>()};
}

// ---------------------------------------------------------------------------
// The kernel, on leaves that require grad.
// ---------------------------------------------------------------------------

struct Kernel {
  Result result;
  int64_t count = 0;
};

Kernel RunListwise(const at::Tensor& hidden, const at::Tensor& yes_no,
                   const std::vector<int64_t>& sizes, double tau, RerankerScore score) {
  at::Tensor h = hidden.detach().clone().requires_grad_();
  at::Tensor w = yes_no.detach().clone().requires_grad_();
  LossSum out = listwise_reranker_loss(reranker_logit_diff(h, w), Offsets(sizes), tau, score);
  out.sum.backward();
  return {{out.sum.detach().to(torch::kDouble), h.grad().to(torch::kDouble),
           w.grad().to(torch::kDouble)},
          out.count.item<int64_t>()};
}

Kernel RunPointwise(const at::Tensor& hidden, const at::Tensor& yes_no, const at::Tensor& labels) {
  at::Tensor h = hidden.detach().clone().requires_grad_();
  at::Tensor w = yes_no.detach().clone().requires_grad_();
  LossSum out = pointwise_reranker_loss(reranker_logit_diff(h, w), labels);
  out.sum.backward();
  return {{out.sum.detach().to(torch::kDouble), h.grad().to(torch::kDouble),
           w.grad().to(torch::kDouble)},
          out.count.item<int64_t>()};
}

// max |actual - expected| <= rtol * scale.
void ExpectClose(const at::Tensor& actual, const at::Tensor& expected, double rtol, double scale,
                 const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  ASSERT_TRUE(torch::isfinite(actual).all().item<bool>()) << what << " has a non-finite value";
  const double err = (actual - expected).abs().max().item<double>();
  EXPECT_LE(err, rtol * scale) << what << ": max abs error " << err << ", scale " << scale;
}

// hidden (N, H) and yes_no (2, H) with |Δ| of a few units, where the plain
// reference is exact enough and the listwise softmax is not saturated.
struct Inputs {
  at::Tensor hidden;
  at::Tensor yes_no;
};

Inputs RandomInputs(int64_t n, int64_t h) {
  return {torch::randn({n, h}), torch::randn({2, h}) * 0.3};
}

// fp32 compute: Δ is an H-term fp32 dot product whose rounding, a few 1e-7 of
// Σ_k |h_k (w_yes − w_no)_k|, is about 1e-6 of |Δ| here; log σ and the
// log-sum-exp add a few 1e-7 relative. The loss moves by at most |δx_j| per
// counted candidate (|∂L/∂x_j| <= 1), so its error is about 1e-6 of Σ |x_j|;
// 1e-5 leaves an order of magnitude of margin. Gradients likewise, norm-wise.
constexpr double kFp32Rtol = 1e-5;

// Gradients are compared against their bounds, |d_hidden_ik| <= |w_yes − w_no|_k / τ
// and |d_yes_no_k| <= Σ_i |h_ik| / τ, not against their own size: a saturated
// group has gradients far below the bound whose absolute error is still set by
// the larger terms. ∂L/∂x_j = softmax_j − [j = 0] comes from exp(x_j − lse), a
// difference of fp32 numbers up to max |x|, so it carries an absolute error of
// about 1e-7 max |x| on top of Δ's rounding: the tolerance is
// kFp32Rtol (1 + max |x|), plus `rounding` for gradients handed back in a
// narrower dtype.
void ExpectGradsClose(const Result& got, const Result& ref, const Inputs& in, double tau,
                      double rounding, const std::string& what) {
  const at::Tensor h = in.hidden.to(torch::kDouble);
  const at::Tensor w = in.yes_no.to(torch::kDouble);
  const double tol = rounding + kFp32Rtol * (1 + ref.max_abs_x);
  ExpectClose(got.d_hidden, ref.d_hidden, tol, (w[0] - w[1]).abs().max().item<double>() / tau,
              what + ", d_hidden");
  ExpectClose(got.d_yes_no, ref.d_yes_no, tol, h.abs().sum(0).max().item<double>() / tau,
              what + ", d_yes_no");
}

// ---------------------------------------------------------------------------
// Against the reference
// ---------------------------------------------------------------------------

TEST_F(RerankerLossTest, ListwiseMatchesFloat64Reference) {
  const std::vector<int64_t> sizes = {3, 1, 5, 2, 0, 8, 4};
  const Inputs in = RandomInputs(Total(sizes), 32);
  for (RerankerScore score : kScores) {
    for (double tau : {1.0, 0.05}) {
      const std::string what = SeedTrace() + ", " + Name(score) + ", tau " + std::to_string(tau);
      Kernel got = RunListwise(in.hidden, in.yes_no, sizes, tau, score);
      Result ref = ListwiseReference(in.hidden, in.yes_no, sizes, tau, score);
      EXPECT_EQ(got.count, 5) << what << ": groups of size 0 and 1 do not count";
      ExpectClose(got.result.sum, ref.sum, kFp32Rtol, ref.scale, what + ", sum");
      ExpectGradsClose(got.result, ref, in, tau, 0.0, what);
      EXPECT_TRUE(got.result.d_hidden[3].eq(0).all().item<bool>())
          << what << ": the candidate of a group of size 1 must get zero gradient";
    }
  }
}

TEST_F(RerankerLossTest, PointwiseMatchesFloat64Reference) {
  const Inputs in = RandomInputs(41, 32);
  const at::Tensor labels = torch::randint(2, {41}, torch::kLong);
  Kernel got = RunPointwise(in.hidden, in.yes_no, labels);
  Result ref = PointwiseReference(in.hidden, in.yes_no, labels);
  EXPECT_EQ(got.count, 41) << SeedTrace();
  // Every term is positive and |∂L_i/∂Δ_i| <= L_i, so each term's relative
  // error is at most Δ's absolute error (about 1e-6 here): kFp32Rtol of the sum.
  ExpectClose(got.result.sum, ref.sum, kFp32Rtol, ref.scale, SeedTrace() + ", sum");
  ExpectGradsClose(got.result, ref, in, 1.0, 0.0, SeedTrace());
}

TEST_F(RerankerLossTest, Bf16InputsAccumulateInFp32) {
  const std::vector<int64_t> sizes = {4, 2, 1, 6};
  Inputs in = RandomInputs(Total(sizes), 64);
  in.hidden = in.hidden.to(torch::kBFloat16);
  in.yes_no = in.yes_no.to(torch::kBFloat16);
  const at::Tensor delta = reranker_logit_diff(in.hidden, in.yes_no);
  EXPECT_EQ(delta.scalar_type(), torch::kFloat);
  // The bf16 values are exact in fp32 and float64, so the reference on the
  // rounded inputs is the exact answer and only fp32 accumulation separates
  // the kernel from it. A 64-term fp32 dot product is within 64 u = 4e-6
  // (u = 2^-24) of Σ_k |h_k d_k|, d = w_yes − w_no; kFp32Rtol of that is
  // rigorous. A bf16 accumulation or result would be off by ~2^-9 of |Δ|.
  const at::Tensor h64 = in.hidden.to(torch::kDouble);
  const at::Tensor w64 = in.yes_no.to(torch::kDouble);
  const at::Tensor want_delta = h64.mv(w64[0]) - h64.mv(w64[1]);
  const double dot_scale = h64.abs().mv((w64[0] - w64[1]).abs()).max().item<double>();
  ExpectClose(delta.to(torch::kDouble), want_delta, kFp32Rtol, dot_scale, SeedTrace() + ", delta");
  for (RerankerScore score : kScores) {
    const std::string what = SeedTrace() + ", " + Name(score);
    Kernel got = RunListwise(in.hidden, in.yes_no, sizes, 0.1, score);
    Result ref = ListwiseReference(in.hidden, in.yes_no, sizes, 0.1, score);
    ExpectClose(got.result.sum, ref.sum, kFp32Rtol, ref.scale, what + ", sum");
    // The gradients are handed back in bf16: 8 significant bits, 2^-9 relative
    // rounding of values at most their bound; 2^-8 leaves a factor 2.
    ExpectGradsClose(got.result, ref, in, 0.1, 0x1p-8, what);
  }
  const at::Tensor labels = torch::randint(2, {Total(sizes)}, torch::kLong);
  Kernel got = RunPointwise(in.hidden, in.yes_no, labels);
  Result ref = PointwiseReference(in.hidden, in.yes_no, labels);
  ExpectClose(got.result.sum, ref.sum, kFp32Rtol, ref.scale, SeedTrace() + ", pointwise sum");
  ExpectGradsClose(got.result, ref, in, 1.0, 0x1p-8, SeedTrace() + ", pointwise");
}

// Central differences in float64 at eps = 1e-6: truncation ~eps^2 |L'''| and
// cancellation ~1e-16 |L| / eps, both below 1e-8, far below the 1e-7 tolerance.
// Row 2 of hidden is zero, so Δ_2 = 0 exactly: the point where autograd through
// min(Δ, 0) or |Δ| would take a one-sided subgradient instead of σ(0) = 1/2.
TEST_F(RerankerLossTest, GradientsMatchFiniteDifferencesInFloat64) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  const std::vector<int64_t> sizes = {3, 1, 4};
  at::Tensor hidden = torch::randn({8, 3}, f64);
  hidden[2].zero_();
  at::Tensor yes_no = torch::randn({2, 3}, f64);
  const at::Tensor labels = torch::tensor({1, 0, 0, 1, 0, 1, 1, 0}, torch::kLong);
  constexpr double kTau = 0.5;
  constexpr double kEps = 1e-6;

  struct Case {
    std::string name;
    std::function<double(const at::Tensor&, const at::Tensor&)> loss;
    Kernel got;
  };
  std::vector<Case> cases;
  for (RerankerScore score : kScores) {
    cases.push_back({"listwise " + Name(score),
                     [&, score](const at::Tensor& h, const at::Tensor& w) {
                       return listwise_reranker_loss(reranker_logit_diff(h, w), Offsets(sizes),
                                                     kTau, score)
                           .sum.item<double>();
                     },
                     RunListwise(hidden, yes_no, sizes, kTau, score)});
  }
  cases.push_back(
      {"pointwise",
       [&](const at::Tensor& h, const at::Tensor& w) {
         return pointwise_reranker_loss(reranker_logit_diff(h, w), labels).sum.item<double>();
       },
       RunPointwise(hidden, yes_no, labels)});

  for (const Case& c : cases) {
    ASSERT_EQ(c.got.result.sum.scalar_type(), torch::kDouble);
    for (bool of_hidden : {true, false}) {
      const at::Tensor& x = of_hidden ? hidden : yes_no;
      at::Tensor numeric = torch::zeros_like(x);
      for (int64_t i = 0; i < x.numel(); ++i) {
        at::Tensor plus = x.clone();
        at::Tensor minus = x.clone();
        plus.view(-1)[i] += kEps;
        minus.view(-1)[i] -= kEps;
        const double fp = of_hidden ? c.loss(plus, yes_no) : c.loss(hidden, plus);
        const double fm = of_hidden ? c.loss(minus, yes_no) : c.loss(hidden, minus);
        numeric.view(-1)[i] = (fp - fm) / (2 * kEps);
      }
      const at::Tensor& analytic = of_hidden ? c.got.result.d_hidden : c.got.result.d_yes_no;
      EXPECT_TRUE(torch::allclose(analytic, numeric, 1e-7, 1e-7))
          << SeedTrace() << ", " << c.name << (of_hidden ? ", d_hidden" : ", d_yes_no")
          << "\nanalytic\n"
          << analytic << "\nnumeric\n"
          << numeric;
    }
  }
}

// ---------------------------------------------------------------------------
// Score options
// ---------------------------------------------------------------------------

// One group, positive Δ = 2, negative Δ = −1, τ = 1, worked from the header:
//   logit_diff: −2 + log(e^2 + e^−1) = log(1 + e^−3)
//   logsigmoid: s = −log(1 + e^−Δ); −s_0 + log(e^s_0 + e^s_1) = log(1 + e^(s_1 − s_0))
TEST_F(RerankerLossTest, ScoreOptionsFollowTheirDefinitions) {
  const at::Tensor delta = torch::tensor({2.0, -1.0}, torch::kDouble);
  const double s0 = -std::log1p(std::exp(-2.0));
  const double s1 = -std::log1p(std::exp(1.0));
  // fp64 inputs are computed in fp64: 1e-14 is a few ulps of these O(1) values.
  EXPECT_NEAR(listwise_reranker_loss(delta, Offsets({2}), 1.0, RerankerScore::kLogitDiff)
                  .sum.item<double>(),
              std::log1p(std::exp(-3.0)), 1e-14);
  EXPECT_NEAR(listwise_reranker_loss(delta, Offsets({2}), 1.0, RerankerScore::kLogSigmoid)
                  .sum.item<double>(),
              std::log1p(std::exp(s1 - s0)), 1e-14);
  EXPECT_NEAR(listwise_reranker_loss(delta, Offsets({2})).sum.item<double>(),
              std::log1p(std::exp(s1 - s0)), 1e-14)
      << "the default score is logsigmoid";
}

// kLogSigmoid on Δ is kLogitDiff on log σ(Δ), values and gradients.
TEST_F(RerankerLossTest, LogSigmoidScoreIsLogitDiffScoreOfLogSigmoid) {
  const std::vector<int64_t> sizes = {5, 2, 1, 7};
  const at::Tensor base = torch::randn({Total(sizes)}, torch::kDouble) * 4;
  at::Tensor a = base.clone().requires_grad_();
  at::Tensor b = base.clone().requires_grad_();
  LossSum via_score = listwise_reranker_loss(a, Offsets(sizes), 0.2, RerankerScore::kLogSigmoid);
  LossSum via_input =
      listwise_reranker_loss(torch::log_sigmoid(b), Offsets(sizes), 0.2, RerankerScore::kLogitDiff);
  via_score.sum.backward();
  via_input.sum.backward();
  // Same fp64 ops in the same order up to the log σ: a few ulps.
  EXPECT_NEAR(via_score.sum.item<double>(), via_input.sum.item<double>(),
              1e-13 * std::abs(via_input.sum.item<double>()))
      << SeedTrace();
  EXPECT_TRUE(torch::allclose(a.grad(), b.grad(), 1e-13, 1e-15)) << SeedTrace();
  const double plain = listwise_reranker_loss(base, Offsets(sizes), 0.2, RerankerScore::kLogitDiff)
                           .sum.item<double>();
  EXPECT_GT(std::abs(plain - via_score.sum.item<double>()), 1e-3)
      << SeedTrace() << ": the score option must change the loss";
}

// ---------------------------------------------------------------------------
// Groups that do not count
// ---------------------------------------------------------------------------

TEST_F(RerankerLossTest, NoCountedGroupGivesZeroSumZeroCountAndZeroGradients) {
  for (const std::vector<int64_t>& sizes :
       {std::vector<int64_t>{1, 0, 1, 1}, std::vector<int64_t>{}, std::vector<int64_t>{0}}) {
    const Inputs in = RandomInputs(Total(sizes), 8);
    for (RerankerScore score : kScores) {
      at::Tensor h = in.hidden.clone().requires_grad_();
      at::Tensor w = in.yes_no.clone().requires_grad_();
      LossSum out = listwise_reranker_loss(reranker_logit_diff(h, w), Offsets(sizes), 0.1, score);
      EXPECT_EQ(out.count.item<int64_t>(), 0);
      EXPECT_EQ(out.count.scalar_type(), torch::kLong);
      EXPECT_EQ(out.sum.item<float>(), 0.f);
      ASSERT_TRUE(out.sum.requires_grad()) << "the trainer backpropagates every micro-batch";
      out.sum.backward();
      EXPECT_TRUE(h.grad().eq(0).all().item<bool>()) << h.grad();
      EXPECT_TRUE(w.grad().eq(0).all().item<bool>()) << w.grad();
    }
  }
}

TEST_F(RerankerLossTest, OnlyCandidatesOfCountedGroupsGetGradient) {
  const std::vector<int64_t> sizes = {1, 3, 0, 1, 2, 1};
  at::Tensor delta = (torch::randn({Total(sizes)}) * 3).requires_grad_();
  LossSum out = listwise_reranker_loss(delta, Offsets(sizes));
  EXPECT_EQ(out.count.item<int64_t>(), 2);
  out.sum.backward();
  const at::Tensor counted =
      torch::tensor({false, true, true, true, false, true, true, false}, torch::kBool);
  EXPECT_TRUE(delta.grad().masked_select(counted.logical_not()).eq(0).all().item<bool>())
      << delta.grad();
  // In a counted group ∂L/∂x is softmax − one-hot, nonzero for every member
  // unless a softmax weight rounds to 0 or 1 in fp32, which needs scores
  // about 16 apart: a 5-sigma draw of Δ here.
  EXPECT_TRUE(delta.grad().masked_select(counted).ne(0).all().item<bool>()) << SeedTrace() << "\n"
                                                                            << delta.grad();
}

// ---------------------------------------------------------------------------
// Extreme inputs and the gradient bound
// ---------------------------------------------------------------------------

// |∂sum/∂Δ_i| <= 1/τ listwise and <= 1 pointwise, for any Δ. The gradients are
// computed in fp32; the only rounding that can push one past the bound is the
// final product by 1/τ, half an ulp: the bound gets a 1e-6 relative slack.
TEST_F(RerankerLossTest, LogitDiffGradientIsBoundedAndFiniteUpToTenThousand) {
  std::mt19937 rng(static_cast<uint32_t>(torch::randint(1 << 30, {1}).item<int64_t>()));
  std::vector<int64_t> sizes;
  for (int g = 0; g < 40; ++g) sizes.push_back(std::uniform_int_distribution<int64_t>(1, 8)(rng));
  const int64_t n = Total(sizes);
  // Magnitudes from 1e-2 to 1e4, signs random, with exact ±1e4 and 0 mixed in.
  at::Tensor base = torch::randn({n}) * torch::pow(10.0, torch::randint(-2, 5, {n}, torch::kFloat));
  base.index_put_({torch::randint(n, {n / 4})}, 1e4);
  base.index_put_({torch::randint(n, {n / 4})}, -1e4);
  base.index_put_({torch::randint(n, {n / 8})}, 0.0);
  base = base.clamp(-1e4, 1e4);
  for (RerankerScore score : kScores) {
    for (double tau : {1.0, 0.1, 0.01}) {
      const std::string what = SeedTrace() + ", " + Name(score) + ", tau " + std::to_string(tau);
      at::Tensor delta = base.clone().requires_grad_();
      LossSum out = listwise_reranker_loss(delta, Offsets(sizes), tau, score);
      ASSERT_TRUE(std::isfinite(out.sum.item<double>())) << what;
      out.sum.backward();
      ASSERT_TRUE(torch::isfinite(delta.grad()).all().item<bool>()) << what;
      EXPECT_LE(delta.grad().abs().max().item<double>(), (1 + 1e-6) / tau) << what;
    }
  }
  at::Tensor delta = base.clone().requires_grad_();
  LossSum out = pointwise_reranker_loss(delta, torch::randint(2, {n}, torch::kLong));
  ASSERT_TRUE(std::isfinite(out.sum.item<double>())) << SeedTrace();
  out.sum.backward();
  ASSERT_TRUE(torch::isfinite(delta.grad()).all().item<bool>()) << SeedTrace();
  EXPECT_LE(delta.grad().abs().max().item<double>(), 1 + 1e-6) << SeedTrace();
}

// The bound is reached: a positive at −1e4 against a negative at +1e4 puts all
// the softmax weight on the negative. Then ∂/∂Δ = (−1/τ) σ(−Δ_0) = −1/τ for the
// positive and, for the negative, (1/τ) s'(1e4): 1/τ with logit_diff, and
// σ(−1e4)/τ = 0 in fp32 with logsigmoid. Pointwise, labels 1 at Δ = −1e4 and 0
// at +1e4 give −1 and +1. Each value is one fp32 rounding from exact.
TEST_F(RerankerLossTest, GradientBoundIsTightAtTenThousand) {
  for (double tau : {1.0, 0.05}) {
    for (RerankerScore score : kScores) {
      at::Tensor delta = torch::tensor({-1e4f, 1e4f}).requires_grad_();
      LossSum out = listwise_reranker_loss(delta, Offsets({2}), tau, score);
      out.sum.backward();
      const double neg_grad = score == RerankerScore::kLogitDiff ? 1 / tau : 0.0;
      EXPECT_NEAR(delta.grad()[0].item<double>(), -1 / tau, 1e-6 / tau) << Name(score);
      EXPECT_NEAR(delta.grad()[1].item<double>(), neg_grad, 1e-6 / tau) << Name(score);
      EXPECT_NEAR(out.sum.item<double>(), (score == RerankerScore::kLogitDiff ? 2e4 : 1e4) / tau,
                  1e-6 * 2e4 / tau)
          << Name(score);
    }
  }
  at::Tensor delta = torch::tensor({-1e4f, 1e4f}).requires_grad_();
  LossSum out = pointwise_reranker_loss(delta, torch::tensor({1, 0}));
  out.sum.backward();
  EXPECT_NEAR(out.sum.item<double>(), 2e4, 1e-2);
  EXPECT_NEAR(delta.grad()[0].item<double>(), -1.0, 1e-6);
  EXPECT_NEAR(delta.grad()[1].item<double>(), 1.0, 1e-6);
}

// From hidden states: Δ of ±1e4 through reranker_logit_diff. Each row's
// gradient is ∂L/∂Δ_i (w_yes − w_no), so |d_hidden_i| <= |w_yes − w_no| / τ
// entry by entry, with the same fp32 slack as above.
TEST_F(RerankerLossTest, HiddenStatesGivingLogitDiffOfTenThousandHaveFiniteGradients) {
  const std::vector<int64_t> sizes = {4, 3, 1, 5, 2};
  Inputs in = RandomInputs(Total(sizes), 16);
  const at::Tensor d = in.yes_no[0] - in.yes_no[1];
  in.hidden = in.hidden * (1e4 / in.hidden.mv(d).abs().max());
  constexpr double kTau = 0.05;
  for (RerankerScore score : kScores) {
    Kernel got = RunListwise(in.hidden, in.yes_no, sizes, kTau, score);
    ASSERT_TRUE(std::isfinite(got.result.sum.item<double>())) << SeedTrace() << Name(score);
    ASSERT_TRUE(torch::isfinite(got.result.d_hidden).all().item<bool>()) << Name(score);
    ASSERT_TRUE(torch::isfinite(got.result.d_yes_no).all().item<bool>()) << Name(score);
    const at::Tensor limit = d.abs().to(torch::kDouble).unsqueeze(0) * ((1 + 1e-6) / kTau);
    EXPECT_TRUE(got.result.d_hidden.abs().le(limit).all().item<bool>())
        << SeedTrace() << ", " << Name(score);
  }
  Kernel got = RunPointwise(in.hidden, in.yes_no, torch::randint(2, {Total(sizes)}, torch::kLong));
  ASSERT_TRUE(std::isfinite(got.result.sum.item<double>())) << SeedTrace();
  ASSERT_TRUE(torch::isfinite(got.result.d_hidden).all().item<bool>()) << SeedTrace();
  ASSERT_TRUE(torch::isfinite(got.result.d_yes_no).all().item<bool>()) << SeedTrace();
}

// ---------------------------------------------------------------------------
// Argument checks
// ---------------------------------------------------------------------------

template <typename Fn>
void ExpectError(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one mentioning \"" << needle << "\"";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST_F(RerankerLossTest, RejectsBadInputsNamingTheArgument) {
  const at::Tensor hidden = torch::randn({4, 3});
  const at::Tensor yes_no = torch::randn({2, 3});
  const at::Tensor delta = torch::randn({4});
  ExpectError(
      [&] {
        reranker_logit_diff(hidden, torch::randn({3, 3}));
      },
      "yes_no must be (2, H = 3)");
  ExpectError(
      [&] {
        reranker_logit_diff(hidden, torch::randn({2, 4}));
      },
      "yes_no must be (2, H = 3)");
  ExpectError([&] { reranker_logit_diff(hidden.view(-1), yes_no); }, "hidden must be 2-D");
  ExpectError([&] { reranker_logit_diff(hidden, yes_no.to(torch::kBFloat16)); },
              "yes_no must have hidden's dtype");
  ExpectError([&] { reranker_logit_diff(hidden.to(torch::kInt), yes_no.to(torch::kInt)); },
              "hidden must be fp32, bf16, fp16 or fp64");

  ExpectError(
      [&] {
        listwise_reranker_loss(delta, Offsets({2, 1}));
      },
      "group_offsets must end at N = 4, got 3");
  ExpectError(
      [&] {
        listwise_reranker_loss(delta, torch::tensor({1, 4}, torch::kLong));
      },
      "group_offsets must start at 0");
  ExpectError(
      [&] {
        listwise_reranker_loss(delta, torch::tensor({0, 3, 2, 4}, torch::kLong));
      },
      "group_offsets must be non-decreasing, got [2] = 2 < [1] = 3");
  ExpectError([&] { listwise_reranker_loss(delta, Offsets({4}).to(torch::kInt)); },
              "group_offsets must be a non-empty 1-D int64 CPU tensor");
  ExpectError([&] { listwise_reranker_loss(delta, Offsets({4}), 0.0); },
              "temperature must be > 0 and finite, got 0");
  ExpectError([&] { listwise_reranker_loss(delta, Offsets({4}), std::nan("")); },
              "temperature must be > 0 and finite");
  ExpectError([&] { listwise_reranker_loss(delta.to(torch::kBFloat16), Offsets({4})); },
              "logit_diff must be fp32 or fp64");
  ExpectError(
      [&] {
        listwise_reranker_loss(delta.view({2, 2}), Offsets({4}));
      },
      "logit_diff must be 1-D");

  ExpectError(
      [&] {
        pointwise_reranker_loss(delta, torch::tensor({0, 1, 2, 0}));
      },
      "labels[2] = 2 is not 0 or 1");
  ExpectError(
      [&] {
        pointwise_reranker_loss(delta, torch::tensor({0.f, 0.5f, 1.f, 0.f}));
      },
      "labels[1] = 0.5 is not 0 or 1");
  ExpectError(
      [&] {
        pointwise_reranker_loss(delta, torch::tensor({0, 1, 1}));
      },
      "labels must be 1-D of length N = 4");
}

TEST_F(RerankerLossTest, PointwiseAcceptsBoolIntegerAndFloatLabels) {
  const at::Tensor delta = torch::randn({6}) * 3;
  const at::Tensor as_bool = torch::tensor({true, false, true, true, false, false});
  const double want = pointwise_reranker_loss(delta, as_bool).sum.item<double>();
  EXPECT_EQ(pointwise_reranker_loss(delta, as_bool.to(torch::kLong)).sum.item<double>(), want);
  EXPECT_EQ(pointwise_reranker_loss(delta, as_bool.to(torch::kFloat)).sum.item<double>(), want);
  EXPECT_EQ(pointwise_reranker_loss(delta, as_bool).count.item<int64_t>(), 6);
}

}  // namespace
}  // namespace ballast::kernels
