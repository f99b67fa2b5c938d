// GPU tests of the CUDA linear cross-entropy (kernels/cuda/linear_cross_entropy.cu).
// Each skips without a device. The reference is F::cross_entropy on the full
// logits hidden @ weight^T in float64 on the GPU, with gradients by autograd.
#include "kernels/cuda/linear_cross_entropy_cuda.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>

#include "kernels/loss.h"
#include "tests/unit/kernels/linear_cross_entropy_reference.h"

namespace ballast::kernels {
namespace {

using cross_entropy_reference::ExpectClose;
using cross_entropy_reference::kIgnore;
using cross_entropy_reference::RandomTargets;
using cross_entropy_reference::Reference;
using cross_entropy_reference::Result;
using cross_entropy_reference::RunKernel;

class LinearCrossEntropyCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  }
};

// bf16 / fp16 inputs are exact in float64, and the logits and log-sum-exp are
// fp32 (tensor-core products with fp32 accumulation over H terms, fp32 sums
// over V): the loss is good to ~1e-6 relative; 1e-4 leaves margin. The
// gradients are rounded to the input dtype once, and dz once more as an
// operand of the gradient products: 2^-9 (bf16) relative each, so 1e-2; fp16
// has 2^-11, so 4e-3.
constexpr double kSumRtol = 1e-4;
constexpr double kBf16GradRtol = 1e-2;
constexpr double kFp16GradRtol = 4e-3;

TEST_F(LinearCrossEntropyCuda, QwenVocabMatchesCrossEntropyOfFullLogitsInBf16AndFp16) {
  torch::manual_seed(11);
  constexpr int64_t kVocab = 151936;
  constexpr int64_t kTokens = 300;
  constexpr int64_t kHidden = 256;
  for (auto [dtype, grad_rtol] : {std::pair<torch::Dtype, double>{torch::kBFloat16, kBf16GradRtol},
                                  {torch::kHalf, kFp16GradRtol}}) {
    auto opts = torch::TensorOptions().device(torch::kCUDA);
    at::Tensor hidden = torch::randn({kTokens, kHidden}, opts).to(dtype);
    at::Tensor weight = (torch::randn({kVocab, kHidden}, opts) * 0.1).to(dtype);
    at::Tensor targets = RandomTargets(kTokens, kVocab, 7, torch::kCUDA);
    at::Tensor token_weights = torch::rand({kTokens}, opts) + 0.5;
    // upstream 1e-5 is 1 / (supervised tokens of a large step): the gradient
    // per logit is ~1e-11, below fp16's smallest subnormal unless rescaled.
    for (double upstream : {1.0, 1e-5}) {
      const std::string what =
          std::string(c10::toString(dtype)) + " upstream " + std::to_string(upstream);
      Result got = RunKernel(hidden, weight, targets, token_weights, 1e-4, upstream);
      Result ref = Reference(hidden, weight, targets, token_weights, 1e-4, upstream);
      ExpectClose(got.sum, ref.sum, kSumRtol, what + " sum");
      ExpectClose(got.d_hidden, ref.d_hidden, grad_rtol, what + " d_hidden");
      ExpectClose(got.d_weight, ref.d_weight, grad_rtol, what + " d_weight");
    }
  }
}

TEST_F(LinearCrossEntropyCuda, Fp32MatchesFloat64AcrossChunkBoundaries) {
  torch::manual_seed(12);
  // Counted rows past one row chunk; vocab ragged past one tile, exactly one
  // tile, and a single entry.
  const int64_t tokens = kLceCudaChunkRows + 300;
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t vocab : {kLceCudaChunkVocab + 13, kLceCudaChunkVocab, int64_t{1}}) {
    at::Tensor hidden = torch::randn({tokens, 32}, opts);
    at::Tensor weight = torch::randn({vocab, 32}, opts) * 0.5;
    at::Tensor targets = RandomTargets(tokens, vocab, 30, torch::kCUDA);
    at::Tensor token_weights = torch::rand({tokens}, opts);
    Result got = RunKernel(hidden, weight, targets, token_weights, 1e-3, 0.37);
    Result ref = Reference(hidden, weight, targets, token_weights, 1e-3, 0.37);
    // fp32 throughout (cuBLAS fp32, TF32 off by default): a few 1e-7 relative
    // per logit and per log-sum-exp; 5e-5 leaves margin for longer sums.
    const std::string what = "V = " + std::to_string(vocab);
    ExpectClose(got.sum, ref.sum, 5e-5, what + " sum");
    ExpectClose(got.d_hidden, ref.d_hidden, 5e-5, what + " d_hidden");
    ExpectClose(got.d_weight, ref.d_weight, 5e-5, what + " d_weight");
  }
}

// The review's trigger: unit dW summed over 8192 tokens passed 65504 and
// became inf when it was rounded to fp16 before the 1 / T upstream was
// applied. Now the upstream enters the fp32 coefficients first. Tolerances as
// kFp16GradRtol / kBf16GradRtol above.
TEST_F(LinearCrossEntropyCuda, Fp16GradientsScaleBeforeRoundingSoTheyDoNotOverflow) {
  torch::manual_seed(22);
  for (auto [dtype, rtol] : {std::pair<torch::Dtype, double>{torch::kHalf, kFp16GradRtol},
                             {torch::kBFloat16, kBf16GradRtol}}) {
    cross_entropy_reference::ExpectOverflowTriggerScalesBeforeRounding(dtype, torch::kCUDA, rtol);
  }
}

// fp32 stays IEEE fp32 when the program allows TF32 globally: with H = 1024
// TF32's 10-bit mantissa would put ~1e-3 relative error on the logits, far
// past the 5e-5 of fp32.
TEST_F(LinearCrossEntropyCuda, Fp32IgnoresTheGlobalTf32Setting) {
  torch::manual_seed(23);
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  at::Tensor hidden = torch::randn({512, 1024}, opts);
  at::Tensor weight = torch::randn({3000, 1024}, opts) * 0.05;
  at::Tensor targets = RandomTargets(512, 3000, 9, torch::kCUDA);
  const bool was = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuBLAS(true);
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 0.0, 0.5);
  at::globalContext().setAllowTF32CuBLAS(was);
  Result ref = Reference(hidden, weight, targets, std::nullopt, 0.0, 0.5);
  ExpectClose(got.sum, ref.sum, 5e-5, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, 5e-5, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, 5e-5, "d_weight");
}

TEST_F(LinearCrossEntropyCuda, Float64MatchesReferenceToRounding) {
  torch::manual_seed(13);
  auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kDouble);
  at::Tensor hidden = torch::randn({50, 16}, opts);
  at::Tensor weight = torch::randn({900, 16}, opts);
  at::Tensor targets = RandomTargets(50, 900, 4, torch::kCUDA);
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 0.1, 1.0);
  Result ref = Reference(hidden, weight, targets, std::nullopt, 0.1, 1.0);
  EXPECT_EQ(got.sum.scalar_type(), torch::kDouble);
  ExpectClose(got.sum, ref.sum, 1e-12, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, 1e-12, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, 1e-12, "d_weight");
}

TEST_F(LinearCrossEntropyCuda, LogitsOfTenThousandGiveFiniteLossAndGradients) {
  torch::manual_seed(14);
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  at::Tensor hidden = torch::randn({24, 16}, opts);
  at::Tensor weight = torch::randn({300, 16}, opts);
  hidden = hidden * (1e4 / hidden.mm(weight.t()).abs().max());
  at::Tensor targets = RandomTargets(24, 300, 6, torch::kCUDA);
  Result got = RunKernel(hidden, weight, targets, std::nullopt, 1e-4, 1.0);
  Result ref = Reference(hidden, weight, targets, std::nullopt, 1e-4, 1.0);
  ASSERT_TRUE(std::isfinite(got.sum.item<double>()));
  // Losses are differences of ~1e4 logits: fp32 error is relative to 1e4.
  ExpectClose(got.sum, ref.sum, 1e-4, "sum");
  ExpectClose(got.d_hidden, ref.d_hidden, 1e-4, "d_hidden");
  ExpectClose(got.d_weight, ref.d_weight, 1e-4, "d_weight");
}

TEST_F(LinearCrossEntropyCuda, AllIgnoredGivesZeroSumZeroCountAndZeroGradients) {
  auto opts = torch::TensorOptions().device(torch::kCUDA);
  at::Tensor hidden = torch::randn({5, 4}, opts).to(torch::kBFloat16).requires_grad_();
  at::Tensor weight = torch::randn({9, 4}, opts).to(torch::kBFloat16).requires_grad_();
  at::Tensor targets = torch::full({5}, kIgnore, opts.dtype(torch::kLong));
  LossSum out = linear_cross_entropy(hidden, weight, targets, std::nullopt, kIgnore, 1e-3);
  EXPECT_EQ(out.count.item<int64_t>(), 0);
  EXPECT_EQ(out.sum.item<float>(), 0.f);
  out.sum.backward();
  EXPECT_TRUE(hidden.grad().eq(0).all().item<bool>());
  EXPECT_TRUE(weight.grad().eq(0).all().item<bool>());
}

TEST_F(LinearCrossEntropyCuda, MatchesCpuKernelOnTheSameInputs) {
  torch::manual_seed(15);
  at::Tensor hidden = torch::randn({200, 64}).to(torch::kBFloat16);
  at::Tensor weight = (torch::randn({20000, 64}) * 0.2).to(torch::kBFloat16);
  at::Tensor targets = RandomTargets(200, 20000, 9);
  Result cpu = RunKernel(hidden, weight, targets, std::nullopt, 1e-3, 1.0);
  Result gpu = RunKernel(hidden.cuda(), weight.cuda(), targets.cuda(), std::nullopt, 1e-3, 1.0);
  ExpectClose(gpu.sum.cpu(), cpu.sum, kSumRtol, "sum");
  ExpectClose(gpu.d_hidden.cpu(), cpu.d_hidden, kBf16GradRtol, "d_hidden");
  ExpectClose(gpu.d_weight.cpu(), cpu.d_weight, kBf16GradRtol, "d_weight");
}

}  // namespace
}  // namespace ballast::kernels
