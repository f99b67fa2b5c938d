#include "kernels/grad_norm.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

namespace ballast::kernels {
namespace {

// Float64 reference: sqrt of the sum of every element squared.
double ReferenceNorm(const std::vector<at::Tensor>& tensors) {
  double total = 0.0;
  for (const auto& t : tensors) total += t.to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(total);
}

std::vector<at::Tensor> RandomTensors(torch::Dtype dtype) {
  // Sizes cross the 2^16 chunk boundary, and one is empty.
  std::vector<at::Tensor> ts;
  for (int64_t n : {1, 7, 65535, 65536, 65537, 300001, 0})
    ts.push_back(torch::randn({n}).to(dtype));
  return ts;
}

TEST(GradNorm, MatchesFloat64ReferenceAcrossChunkBoundaries) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    auto ts = RandomTensors(dtype);
    GradNormResult r = grad_norm(ts);
    // The CPU path accumulates in fp64 and rounds once to fp32: one fp32 ulp.
    EXPECT_NEAR(r.norm.item<float>(), ReferenceNorm(ts), 2e-7 * ReferenceNorm(ts)) << dtype;
    ASSERT_EQ(r.sum_squares.numel(), static_cast<int64_t>(ts.size()));
    for (size_t i = 0; i < ts.size(); ++i) {
      const double want = ts[i].to(torch::kDouble).pow(2).sum().item<double>();
      EXPECT_NEAR(r.sum_squares[i].item<double>(), want, 1e-6 * want + 1e-30);
    }
    EXPECT_EQ(r.first_nonfinite, -1);
  }
}

TEST(GradNorm, NamesFirstTensorWithNonFiniteValue) {
  auto ts = RandomTensors(torch::kFloat);
  ts[5][70000] = std::numeric_limits<float>::infinity();
  ts[2][3] = std::numeric_limits<float>::quiet_NaN();
  GradNormResult r = grad_norm(ts);
  EXPECT_EQ(r.first_nonfinite, 2);
  EXPECT_FALSE(std::isfinite(r.norm.item<float>()));
}

TEST(GradNorm, UnlocatedTheNonFiniteTensorIsTheNonFiniteSumOfSquares) {
  // What a trainer reads instead of first_nonfinite, so that finding it costs
  // no read from the device: the fp64 sums of squares of fp32, bf16 and fp16
  // values are non-finite exactly where a value is.
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto ts = RandomTensors(dtype);
    // Finite, with a square past the dtype's own range.
    ts[1][0] = dtype == torch::kHalf ? 60000.0 : std::numeric_limits<float>::max() / 2;
    ts[4][5] = std::numeric_limits<float>::quiet_NaN();
    ts[5][9] = -std::numeric_limits<float>::infinity();
    GradNormResult r = grad_norm(ts, /*locate_nonfinite=*/false);
    EXPECT_EQ(r.first_nonfinite, -1) << dtype;
    for (size_t i = 0; i < ts.size(); ++i) {
      EXPECT_EQ(std::isfinite(r.sum_squares[i].item<double>()), i != 4 && i != 5)
          << dtype << " tensor " << i;
    }
  }
}

TEST(GradNorm, FiniteOverflowIsInfNormButNotNonFiniteTensor) {
  // 1e30^2 overflows fp32, but the gradient itself holds no NaN or inf.
  auto ts = std::vector<at::Tensor>{torch::full({4}, 1e30f)};
  GradNormResult r = grad_norm(ts);
  EXPECT_EQ(r.first_nonfinite, -1);
  EXPECT_NEAR(r.norm.item<float>(), 2e30f, 1e24f);
}

// Values whose squares pass fp32's range (|x| > 1.8e19) while the norm stays
// finite in fp32: a path that squared or summed in fp32 would return inf.
std::vector<at::Tensor> NearFp32LimitTensors() {
  return {torch::tensor({2e38f, -1e38f, 3e-38f}), torch::full({1000}, 2e19f),
          torch::full({7}, 1e30f).to(torch::kBFloat16)};
}

void ExpectNearFp32LimitNorm(const GradNormResult& r, const std::vector<at::Tensor>& ts) {
  const double want = ReferenceNorm(ts);
  ASSERT_TRUE(std::isfinite(want) && want < std::numeric_limits<float>::max());
  EXPECT_EQ(r.first_nonfinite, -1);
  ASSERT_TRUE(std::isfinite(r.norm.item<float>()));
  // fp64 sums rounded once to fp32: a few fp32 ulps.
  EXPECT_NEAR(r.norm.item<float>(), want, 1e-6 * want);
  ASSERT_EQ(r.sum_squares.scalar_type(), torch::kDouble);
  for (size_t i = 0; i < ts.size(); ++i) {
    const double sq = ts[i].to(torch::kDouble).pow(2).sum().item<double>();
    EXPECT_NEAR(r.sum_squares[i].item<double>(), sq, 1e-12 * sq) << "tensor " << i;
  }
}

TEST(GradNorm, ValuesNearTheFp32LimitAccumulateInFloat64) {
  const auto ts = NearFp32LimitTensors();
  ExpectNearFp32LimitNorm(grad_norm(ts), ts);
}

TEST(GradNorm, EmptyListAndUndefinedTensorsGiveZero) {
  EXPECT_EQ(grad_norm({}).norm.item<float>(), 0.f);
  GradNormResult r = grad_norm({at::Tensor(), torch::ones({3})});
  EXPECT_FLOAT_EQ(r.norm.item<float>(), std::sqrt(3.f));
}

TEST(GradNorm, RejectsNonContiguousIntegerAndFloat8Tensors) {
  EXPECT_THROW(grad_norm({torch::ones({4, 4}).t()}), c10::Error);
  EXPECT_THROW(grad_norm({torch::ones({4}, torch::kLong)}), c10::Error);
  try {
    grad_norm({torch::ones({4}), torch::ones({4}).to(torch::kFloat8_e4m3fn)});
    FAIL() << "a float8 tensor was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("fp64, fp32, bf16 or fp16"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(GradNormCuda, MatchesCpuOnDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    auto ts = RandomTensors(dtype);
    std::vector<at::Tensor> dev;
    for (auto& t : ts) dev.push_back(t.cuda());
    dev[3][5] = std::numeric_limits<float>::quiet_NaN();
    GradNormResult r = grad_norm(dev);
    EXPECT_EQ(r.first_nonfinite, 3);
    dev[3][5] = 0;
    ts[3][5] = 0;
    r = grad_norm(dev);
    // fp64 accumulation, one rounding to fp32; 1e-5 leaves room for the order of the sums.
    EXPECT_NEAR(r.norm.item<float>(), ReferenceNorm(ts), 1e-5 * ReferenceNorm(ts)) << dtype;
  }
}

TEST(GradNormCuda, ValuesNearTheFp32LimitAccumulateInFloat64) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto ts = NearFp32LimitTensors();
  std::vector<at::Tensor> dev;
  for (const auto& t : ts) dev.push_back(t.cuda());
  ExpectNearFp32LimitNorm(grad_norm(dev), ts);
}

}  // namespace
}  // namespace ballast::kernels
