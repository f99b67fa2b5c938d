#include "kernels/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

namespace ballast::kernels {
namespace {

// transformers' apply_rotary_pos_emb for one of q or k, op by op.
at::Tensor ReferenceRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

// cos and sin as the decoder builds them, from cat(freqs, freqs), and a
// version whose two halves differ, so a backward that relied on that symmetry
// would fail.
std::vector<std::pair<at::Tensor, at::Tensor>> CosSin(int64_t tokens, int64_t dim) {
  at::Tensor freqs = torch::arange(tokens, torch::kFloat).unsqueeze(1) *
                     torch::rand({dim / 2}).unsqueeze(0);  // (T, D/2)
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {{emb.cos(), emb.sin()}, {torch::randn({tokens, dim}), torch::randn({tokens, dim})}};
}

TEST(RopeTest, MatchesHfFormulaForwardAndBackwardOnStridedInput) {
  torch::manual_seed(0);
  const int64_t tokens = 300, heads = 3, dim = 32;
  for (const auto& [cos, sin] : CosSin(tokens, dim)) {
    // q as the fused projection hands it over: a column slice of (T, 2 * heads * D).
    at::Tensor fused = torch::randn({tokens, 2 * heads * dim});
    at::Tensor x = fused.narrow(1, 0, heads * dim).view({tokens, heads, dim});
    ASSERT_FALSE(x.is_contiguous());
    at::Tensor grad = torch::randn({tokens, heads, dim});

    at::Tensor x_ours = x.detach().requires_grad_();
    at::Tensor out = apply_rope(x_ours, cos, sin);
    out.backward(grad);
    at::Tensor x_ref = x.detach().requires_grad_();
    at::Tensor ref = ReferenceRope(x_ref, cos, sin);
    ref.backward(grad);

    EXPECT_TRUE(out.is_contiguous());
    // fp32: each element is two products and a sum in both, so they agree to
    // a rounding or two (an FMA may fuse one product).
    EXPECT_TRUE(torch::allclose(out, ref, 1e-6, 1e-6)) << (out - ref).abs().max();
    EXPECT_TRUE(torch::allclose(x_ours.grad(), x_ref.grad(), 1e-6, 1e-6))
        << (x_ours.grad() - x_ref.grad()).abs().max();
  }
}

TEST(RopeTest, Bf16IsWithinARoundingOfTheOpByOpResult) {
  torch::manual_seed(1);
  const auto [cos, sin] = CosSin(64, 16).front();
  at::Tensor x = torch::randn({64, 2, 16}).to(torch::kBFloat16);
  at::Tensor out = apply_rope(x, cos.to(torch::kBFloat16), sin.to(torch::kBFloat16));
  ASSERT_EQ(out.scalar_type(), torch::kBFloat16);
  at::Tensor exact =
      ReferenceRope(x.to(torch::kDouble), cos.to(torch::kBFloat16).to(torch::kDouble),
                    sin.to(torch::kBFloat16).to(torch::kDouble));
  // One bf16 rounding of a value up to |x| (|cos|, |sin| <= 1): 2^-8 relative.
  EXPECT_LE((out.to(torch::kDouble) - exact).abs().max().item<double>(),
            std::ldexp(1.0, -8) * 2 * x.abs().max().item<float>());
}

TEST(RopeTest, MismatchedShapesAreRefusedNamingThem) {
  const at::Tensor x = torch::randn({8, 2, 16});
  const auto [cos, sin] = CosSin(8, 16).front();
  EXPECT_THROW(apply_rope(torch::randn({8, 2, 15}), cos, sin), c10::Error);
  try {
    apply_rope(x, cos.narrow(0, 0, 7), sin.narrow(0, 0, 7));
    ADD_FAILURE() << "short cos/sin accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("cos and sin must be (T, R)"),
              std::string::npos)
        << e.what_without_backtrace();
  }
}

TEST(RopeTest, PartialRotatesTheFirstRChannelsAndPassesTheRestThrough) {
  // Qwen3.5: head_dim 32 with partial_rotary_factor 0.25 rotates 8 channels.
  torch::manual_seed(2);
  const int64_t tokens = 50, heads = 2, dim = 32, rot = 8;
  for (const auto& [cos, sin] : CosSin(tokens, rot)) {
    at::Tensor fused = torch::randn({tokens, 2 * heads * dim});
    at::Tensor x = fused.narrow(1, heads * dim, heads * dim).view({tokens, heads, dim});
    at::Tensor grad = torch::randn({tokens, heads, dim});

    at::Tensor x_ours = x.detach().requires_grad_();
    at::Tensor out = apply_rope(x_ours, cos, sin);
    out.backward(grad);
    // transformers' Qwen3.5 apply_rotary_pos_emb: rotate x[..., :R], keep the rest.
    at::Tensor x_ref = x.detach().requires_grad_();
    at::Tensor ref = torch::cat(
        {ReferenceRope(x_ref.narrow(2, 0, rot), cos, sin), x_ref.narrow(2, rot, dim - rot)}, 2);
    ref.backward(grad);

    EXPECT_TRUE(torch::allclose(out, ref, 1e-6, 1e-6)) << (out - ref).abs().max();
    EXPECT_TRUE(torch::equal(out.narrow(2, rot, dim - rot), x.narrow(2, rot, dim - rot)));
    EXPECT_TRUE(torch::allclose(x_ours.grad(), x_ref.grad(), 1e-6, 1e-6))
        << (x_ours.grad() - x_ref.grad()).abs().max();
  }
}

TEST(RopeTest, PartialOnTheAtenPathKeepsTheShape) {
  const at::Tensor x = torch::empty({8, 2, 32}, torch::Device(torch::kMeta));
  const at::Tensor cs = torch::empty({8, 8}, torch::Device(torch::kMeta));
  EXPECT_EQ(apply_rope(x, cs, cs).sizes(), x.sizes());
}

TEST(RopeTest, NonCpuTensorsTakeTheAtenPathNotTheHostKernel) {
  // A meta tensor stands in for a device one: it has no host memory, so the
  // host kernel would fail; the ATen path only propagates shapes.
  const at::Tensor x = torch::empty({8, 2, 16}, torch::Device(torch::kMeta));
  const at::Tensor cs = torch::empty({8, 16}, torch::Device(torch::kMeta));
  const at::Tensor out = apply_rope(x, cs, cs);
  EXPECT_EQ(out.device().type(), torch::kMeta);
  EXPECT_EQ(out.sizes(), x.sizes());
}

TEST(RopeTest, CosAndSinOnAnotherDeviceAreRefused) {
  const at::Tensor x = torch::randn({8, 2, 16});
  const at::Tensor cs = torch::empty({8, 16}, torch::Device(torch::kMeta));
  try {
    apply_rope(x, cs, cs);
    ADD_FAILURE() << "cos and sin on another device were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find("on x's device"), std::string::npos)
        << e.what_without_backtrace();
  }
}

}  // namespace
}  // namespace ballast::kernels
