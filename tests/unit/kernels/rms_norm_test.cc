#include "kernels/rms_norm.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace ballast::kernels {
namespace {

constexpr double kEps = 1e-6;

// Float64 reference, straight from the definition.
at::Tensor ReferenceRmsNorm(const at::Tensor& x, const at::Tensor& weight) {
  return weight * x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + kEps);
}

struct Result {
  at::Tensor y, dx, dw;
};

Result ValueAndGrads(const at::Tensor& x_in, const at::Tensor& w_in, const at::Tensor& dy,
                     bool reference) {
  at::Tensor x = x_in.detach().clone().requires_grad_(true);
  at::Tensor w = w_in.detach().clone().requires_grad_(true);
  at::Tensor y = reference ? ReferenceRmsNorm(x, w) : rms_norm(x, w, kEps);
  y.backward(dy.to(y.scalar_type()));
  return {y.detach(), x.grad(), w.grad()};
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(torch::kDouble) - want).norm().item<double>() / want.norm().item<double>();
}

TEST(RmsNorm, Fp32MatchesFloat64Reference) {
  // H below, at and past a multiple of the 8-lane vectors, and (T, heads, D)
  // as the per-head q/k norms use it.
  for (const std::vector<int64_t>& sizes :
       std::vector<std::vector<int64_t>>{{37, 13}, {64, 256}, {300, 8, 32}, {5, 3, 3}}) {
    const at::Tensor x = torch::randn(sizes) * 3;
    const at::Tensor w = torch::rand({sizes.back()}) + 0.5;
    const at::Tensor dy = torch::randn(sizes);
    const Result got = ValueAndGrads(x, w, dy, /*reference=*/false);
    const Result want =
        ValueAndGrads(x.to(torch::kDouble), w.to(torch::kDouble), dy, /*reference=*/true);
    ASSERT_EQ(got.y.sizes(), x.sizes());
    // A few fp32 roundings per value; the weight gradient sums up to 2400
    // rows, whose rounding grows with the square root of the count.
    EXPECT_LT(RelativeError(got.y, want.y), 1e-6) << x.sizes();
    EXPECT_LT(RelativeError(got.dx, want.dx), 2e-6) << x.sizes();
    EXPECT_LT(RelativeError(got.dw, want.dw), 2e-6) << x.sizes();
  }
}

TEST(RmsNorm, Fp32AgreesWithHfOpByOp) {
  const at::Tensor x = torch::randn({128, 96});
  const at::Tensor w = torch::randn({96});
  const at::Tensor dy = torch::randn({128, 96});
  const Result fused = ValueAndGrads(x, w, dy, /*reference=*/false);
  at::Tensor xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
  at::Tensor y = wr * (xr * torch::rsqrt(xr.pow(2).mean(-1, true) + kEps));
  y.backward(dy);
  EXPECT_TRUE(torch::allclose(fused.y, y, 1e-6, 1e-6));
  EXPECT_TRUE(torch::allclose(fused.dx, xr.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fused.dw, wr.grad(), 1e-5, 1e-5));
}

TEST(RmsNorm, ReadsPerHeadViewsOfAFusedProjection) {
  // q of a fused (T, q + k + v) projection, viewed as (T, heads, D): rows
  // are strided, the copy is not.
  const at::Tensor qkv = torch::randn({50, 8 * 16 + 2 * 4 * 16});
  const at::Tensor q = qkv.narrow(1, 0, 8 * 16).view({50, 8, 16});
  ASSERT_FALSE(q.is_contiguous());
  const at::Tensor w = torch::randn({16});
  const at::Tensor dy = torch::randn({50, 8, 16});
  const Result strided = ValueAndGrads(q, w, dy, /*reference=*/false);
  const Result dense = ValueAndGrads(q.contiguous(), w, dy, /*reference=*/false);
  EXPECT_TRUE(torch::equal(strided.y, dense.y));
  EXPECT_TRUE(torch::equal(strided.dx, dense.dx));
  EXPECT_TRUE(torch::equal(strided.dw, dense.dw));
}

TEST(RmsNorm, GradientsAreBitwiseTheSameForAnyThreadCount) {
  // 4096 rows of 64 are 16 blocks of rows for the weight gradient's sums.
  const at::Tensor x = torch::randn({4096, 64});
  const at::Tensor w = torch::randn({64});
  const at::Tensor dy = torch::randn({4096, 64});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = ValueAndGrads(x, w, dy, /*reference=*/false);
  at::set_num_threads(4);
  const Result four = ValueAndGrads(x, w, dy, /*reference=*/false);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.y, four.y));
  EXPECT_TRUE(torch::equal(one.dx, four.dx));
  EXPECT_TRUE(torch::equal(one.dw, four.dw));
}

TEST(RmsNorm, FrozenWeightGetsNoGradientAndZeroRowsStayFinite) {
  at::Tensor x = torch::randn({6, 40});
  x[2].zero_();
  x[4].fill_(1e4);
  const at::Tensor w = torch::randn({40});  // frozen, as in LoRA
  at::Tensor xg = x.clone().requires_grad_(true);
  at::Tensor y = rms_norm(xg, w, kEps);
  y.backward(torch::randn({6, 40}));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_TRUE(torch::isfinite(xg.grad()).all().item<bool>());
  EXPECT_TRUE(torch::equal(y[2], torch::zeros({40})));
}

TEST(RmsNorm, OtherDtypesRunHfOpByOp) {
  const at::Tensor x = torch::randn({16, 48}).to(torch::kBFloat16);
  const at::Tensor w = torch::randn({48}).to(torch::kBFloat16);
  const at::Tensor want =
      w * at::rms_norm(x.to(torch::kFloat), {48}, std::nullopt, kEps).to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(rms_norm(x, w, kEps), want));
}

TEST(RmsNorm, ZeroCentredMatchesQwen35sNormInFp32WithGradients) {
  torch::manual_seed(7);
  // Per-head rows of a fused projection, as q_norm reads them.
  const at::Tensor fused = torch::randn({33, 2 * 4 * 32});
  const at::Tensor x_in = fused.narrow(1, 0, 4 * 64).view({33, 4, 64}).narrow(2, 0, 32);
  const at::Tensor w_in = 0.1 * torch::randn({32});
  const at::Tensor dy = torch::randn({33, 4, 32});
  at::Tensor x = x_in.detach().requires_grad_(true);
  at::Tensor w = w_in.detach().clone().requires_grad_(true);
  at::Tensor y = rms_norm_zero_centred(x, w, kEps);
  y.backward(dy);
  // Qwen3_5RMSNorm in float64: norm(x) * (1 + w).
  at::Tensor xr = x_in.to(torch::kDouble).detach().requires_grad_(true);
  at::Tensor wr = w_in.to(torch::kDouble).detach().requires_grad_(true);
  at::Tensor yr = ReferenceRmsNorm(xr, 1 + wr);
  yr.backward(dy.to(torch::kDouble));
  EXPECT_LE(RelativeError(y, yr), 1e-6);
  EXPECT_LE(RelativeError(x.grad(), xr.grad()), 1e-6);
  EXPECT_LE(RelativeError(w.grad(), wr.grad()), 1e-6);
}

TEST(RmsNorm, ZeroCentredBf16RoundsOnceAsTransformers) {
  const at::Tensor x = torch::randn({16, 48}).to(torch::kBFloat16);
  const at::Tensor w = (0.1 * torch::randn({48})).to(torch::kBFloat16);
  // (norm(x.float()) * (1 + w.float())).type_as(x): no rounding before the product.
  const at::Tensor want =
      (at::rms_norm(x.to(torch::kFloat), {48}, std::nullopt, kEps) * (1.0 + w.to(torch::kFloat)))
          .to(torch::kBFloat16);
  EXPECT_TRUE(torch::equal(rms_norm_zero_centred(x, w, kEps), want));
}

TEST(RmsNorm, RefusesAWeightOfTheWrongSize) {
  try {
    rms_norm(torch::randn({4, 8}), torch::randn({7}), kEps);
    FAIL() << "a weight of the wrong size was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("weight must be (8)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ballast::kernels
