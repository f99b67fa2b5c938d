#include "kernels/swiglu.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

namespace ballast::kernels {
namespace {

// Float64 reference, straight from the definition: silu(g) * u.
at::Tensor ReferenceSwiGlu(const at::Tensor& gate_up) {
  const at::Tensor g = gate_up.chunk(2, 1)[0].to(torch::kDouble);
  const at::Tensor u = gate_up.chunk(2, 1)[1].to(torch::kDouble);
  return g * torch::sigmoid(g) * u;
}

struct Result {
  at::Tensor out, grad;
};

// Output and gradient for the upstream gradient d_out.
Result ValueAndGrad(const at::Tensor& gate_up, const at::Tensor& d_out, bool reference) {
  at::Tensor x = gate_up.detach().clone().requires_grad_(true);
  at::Tensor out = reference ? ReferenceSwiGlu(x) : swiglu(x);
  out.backward(d_out.to(out.scalar_type()));
  return {out.detach(), x.grad()};
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  return (got.to(torch::kDouble) - want).norm().item<double>() / want.norm().item<double>();
}

TEST(SwiGlu, Fp32MatchesFloat64Reference) {
  // Widths below, at and past a multiple of the 8-lane vectors, so that row
  // tails run too; scale 6 reaches both saturated ends of the sigmoid.
  for (int64_t width : {1, 13, 64, 768}) {
    const at::Tensor gate_up = torch::randn({37, 2 * width}) * 6;
    const at::Tensor d_out = torch::randn({37, width});
    const Result got = ValueAndGrad(gate_up, d_out, /*reference=*/false);
    const Result want = ValueAndGrad(gate_up.to(torch::kDouble), d_out, /*reference=*/true);
    ASSERT_EQ(got.out.sizes(), want.out.sizes());
    ASSERT_EQ(got.grad.sizes(), gate_up.sizes());
    // A handful of fp32 roundings per element, none of them amplified.
    EXPECT_LT(RelativeError(got.out, want.out), 1e-6) << "width " << width;
    EXPECT_LT(RelativeError(got.grad, want.grad), 1e-6) << "width " << width;
  }
}

TEST(SwiGlu, Fp32AgreesWithAtenOpByOp) {
  // HF runs silu then mul; the fused pass keeps their operation order, so
  // only exp separates the two.
  const at::Tensor gate_up = torch::randn({64, 2 * 96}) * 3;
  const at::Tensor d_out = torch::randn({64, 96});
  const Result fused = ValueAndGrad(gate_up, d_out, /*reference=*/false);
  at::Tensor x = gate_up.clone().requires_grad_(true);
  at::Tensor out = at::silu(x.chunk(2, 1)[0]) * x.chunk(2, 1)[1];
  out.backward(d_out);
  EXPECT_TRUE(torch::allclose(fused.out, out, /*rtol=*/1e-6, /*atol=*/1e-7));
  EXPECT_TRUE(torch::allclose(fused.grad, x.grad(), /*rtol=*/1e-6, /*atol=*/1e-7));
}

TEST(SwiGlu, ExtremeGatesGiveFiniteValuesAndGradients) {
  at::Tensor gate_up = torch::randn({4, 2 * 9});
  const float gates[] = {1e4f, -1e4f, 88.5f, -88.5f, 200.0f, -200.0f, 0.0f, 1e-30f, -3e38f};
  for (int64_t j = 0; j < 9; ++j) gate_up.select(1, j).fill_(gates[j]);
  const at::Tensor d_out = torch::randn({4, 9});
  const Result got = ValueAndGrad(gate_up, d_out, /*reference=*/false);
  EXPECT_TRUE(torch::isfinite(got.out).all().item<bool>());
  EXPECT_TRUE(torch::isfinite(got.grad).all().item<bool>());
  const Result want = ValueAndGrad(gate_up.to(torch::kDouble), d_out, /*reference=*/true);
  EXPECT_LT(RelativeError(got.out, want.out), 1e-6);
  EXPECT_LT(RelativeError(got.grad, want.grad), 1e-6);
}

TEST(SwiGlu, ReadsStridedRows) {
  // The trainer's gate_up is a GEMM output; a row-strided view must read the
  // same values as its contiguous copy.
  const at::Tensor wide = torch::randn({21, 2 * 40 + 5});
  const at::Tensor view = wide.narrow(1, 3, 2 * 40);
  const at::Tensor d_out = torch::randn({21, 40});
  const Result strided = ValueAndGrad(view, d_out, /*reference=*/false);
  const Result dense = ValueAndGrad(view.contiguous(), d_out, /*reference=*/false);
  EXPECT_TRUE(torch::equal(strided.out, dense.out));
  EXPECT_TRUE(torch::equal(strided.grad, dense.grad));
}

TEST(SwiGlu, OtherDtypesRunOpByOp) {
  // bf16 keeps ATen's roundings (silu rounded to bf16, then the product).
  const at::Tensor gate_up = torch::randn({16, 2 * 24}).to(torch::kBFloat16);
  const at::Tensor halves[] = {gate_up.chunk(2, 1)[0], gate_up.chunk(2, 1)[1]};
  EXPECT_TRUE(torch::equal(swiglu(gate_up), at::silu(halves[0]) * halves[1]));
  // fp64 is exact enough to check gradients by finite differences.
  const at::Tensor x = torch::randn({5, 2 * 3}, torch::kDouble).requires_grad_(true);
  const at::Tensor d_out = torch::randn({5, 3}, torch::kDouble);
  swiglu(x).backward(d_out);
  const double eps = 1e-6;
  for (int64_t j = 0; j < 6; ++j) {
    at::Tensor plus = x.detach().clone(), minus = x.detach().clone();
    plus[2][j] += eps;
    minus[2][j] -= eps;
    const double numeric =
        ((swiglu(plus) - swiglu(minus)) * d_out).sum().item<double>() / (2 * eps);
    EXPECT_NEAR(x.grad()[2][j].item<double>(), numeric, 1e-7) << "column " << j;
  }
}

TEST(SwiGlu, RefusesOddWidths) {
  try {
    swiglu(torch::randn({4, 7}));
    FAIL() << "an odd width was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("gate_up must be (T, 2I)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ballast::kernels
