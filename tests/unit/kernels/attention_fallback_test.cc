// The SDPA fallback (kernels/attention_fallback.h) and the batch's mask plan
// (kernels/attention_plan.h), on the CPU: the fallback is what a GPU runs
// where the project's kernel cannot, so it is checked here against the same
// float64 reference as the kernels.
#include "kernels/attention_fallback.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/attention_plan.h"
#include "tests/unit/kernels/attention_reference.h"

namespace ballast::kernels {
namespace {

namespace ref = attention_reference;

// Packed documents of uneven lengths, one of them empty.
const std::vector<int64_t> kDocs = {1, 70, 0, 129, 33};

TEST(AttentionFallback, SdpaPerDocumentMatchesFloat64ReferenceWithGqa) {
  torch::manual_seed(41);
  const AttentionMask mask = ref::Causal(kDocs);
  // fp64: SDPA's math path in float64, so only summation order differs
  // (1e-12). fp32: sums of a few hundred fp32 terms (~1e-6); 2e-5 as for the
  // CPU kernel.
  for (auto [dtype, tol] :
       {std::pair<torch::Dtype, double>{torch::kDouble, 1e-12}, {torch::kFloat, 2e-5}}) {
    for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}}) {
      const int64_t t = ref::Total(kDocs);
      const auto q = torch::randn({t, hq, 64}).to(dtype);
      const auto k = torch::randn({t, hkv, 64}).to(dtype);
      const auto v = torch::randn({t, hkv, 64}).to(dtype);
      const auto grad_out = torch::randn({t, hq, 64});
      const ref::Grads got = ref::RunWithGrads(
          [&](auto& a, auto& b, auto& c) { return attention_sdpa(a, b, c, mask, 0.125); }, q, k, v,
          grad_out);
      const ref::Grads want = ref::RunWithGrads(
          [&](auto& a, auto& b, auto& c) { return ref::Reference(a, b, c, mask, 0.125); },
          q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), grad_out);
      ref::ExpectCloseMaxNorm(got, want, tol,
                              std::string(c10::toString(dtype)) + " Hq=" + std::to_string(hq) +
                                  " Hkv=" + std::to_string(hkv));
    }
  }
}

TEST(AttentionFallback, EnvironmentSwitchSendsAttentionToTheFallback) {
  torch::manual_seed(42);
  const AttentionMask mask = ref::Causal(kDocs);
  const int64_t t = ref::Total(kDocs);
  const auto q = torch::randn({t, 4, 32});
  const auto k = torch::randn({t, 2, 32});
  const auto v = torch::randn({t, 2, 32});
  const auto direct = attention_sdpa(q, k, v, mask, 0.2);
  ASSERT_EQ(setenv("BALLAST_ATTENTION_FALLBACK", "1", 1), 0);
  const auto forced = attention(q, k, v, mask, 0.2);
  ASSERT_EQ(unsetenv("BALLAST_ATTENTION_FALLBACK"), 0);
  // The same ATen calls on the same inputs: bitwise equal; the kernel's
  // result differs in the last bits.
  EXPECT_TRUE(torch::equal(forced, direct));
  EXPECT_LE(ref::RelativeError(attention(q, k, v, mask, 0.2), direct), 2e-5);
}

TEST(AttentionFallback, MasksSdpaCannotExpressWithoutADenseMaskAreAClearError) {
  const auto q = torch::randn({16, 2, 32});
  for (const AttentionMask& mask : {ref::Causal({16}, 4), ref::BlockDiffusion({16}, 4)}) {
    try {
      attention_sdpa(q, q, q, mask, 0.5);
      ADD_FAILURE() << "no error for mask kind " << static_cast<int>(mask.kind);
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("dense mask"), std::string::npos) << msg;
      EXPECT_NE(msg.find(mask.kind == MaskKind::kCausal ? "sliding window" : "block-diffusion"),
                std::string::npos)
          << msg;
    }
  }
}

// ---------------------------------------------------------------------------
// The mask plan: built once per batch, shared by layers and the backward
// ---------------------------------------------------------------------------

TEST(AttentionFallback, OnePlanServesEveryLayerAndTheBackward) {
  const AttentionMask mask = ref::Causal({40, 90});
  auto q = torch::randn({130, 2, 16}, torch::requires_grad());
  const auto k = torch::randn({130, 2, 16});
  const int64_t before = mask_plans_built();
  at::Tensor h = q;
  for (int layer = 0; layer < 4; ++layer) h = attention(h, k, k, mask, 0.25);
  // A copy of the mask, as an activation-checkpointed layer rebuilds it from
  // the same cu_seqlens tensor.
  AttentionMask copy;
  copy.cu_seqlens = mask.cu_seqlens;
  h = attention(h, k, k, copy, 0.25);
  h.sum().backward();
  EXPECT_EQ(mask_plans_built() - before, 1);
  EXPECT_TRUE(torch::isfinite(q.grad()).all().item<bool>());
}

TEST(AttentionFallback, ANewBatchOrAChangedMaskGetsANewPlan) {
  const auto q = torch::randn({64, 2, 16});
  const AttentionMask a = ref::Causal({30, 34});
  const AttentionMask b = ref::Causal({30, 34});  // same values, another tensor: another batch
  const int64_t before = mask_plans_built();
  attention(q, q, q, a, 0.25);
  attention(q, q, q, b, 0.25);
  EXPECT_EQ(mask_plans_built() - before, 2);
  AttentionMask windowed = a;
  windowed.window = 8;
  attention(q, q, q, windowed, 0.25);
  EXPECT_EQ(mask_plans_built() - before, 3);
  // Edited in place: the version counter moves, so the stale plan is not used.
  a.cu_seqlens[1] = 20;
  const auto out = attention(q, q, q, a, 0.25);
  EXPECT_EQ(mask_plans_built() - before, 4);
  const auto fresh = attention(q, q, q, ref::Causal({20, 44}), 0.25);
  EXPECT_TRUE(torch::equal(out, fresh));
}

TEST(AttentionFallback, PlanTileListsCoverEveryRowOnce) {
  const AttentionMask mask = ref::BlockDiffusion({20, 96}, 8);
  MaskPlan plan(interval_mask(mask, 116));
  for (int64_t block : {16, 32, 64}) {
    for (const at::Tensor& ranges : {plan.intervals().key_ranges, plan.intervals().query_ranges}) {
      std::vector<int> covered(116, 0);
      for (const TileItem& item : make_tile_items(plan.intervals().segments, ranges, block)) {
        EXPECT_LE(item.end - item.begin, block);
        for (int64_t r = item.begin; r < item.end; ++r) ++covered[r];
        if (item.span_count == 2) EXPECT_LT(item.span_end[0], item.span_begin[1]);
      }
      for (int c : covered) EXPECT_EQ(c, 1);
    }
  }
}

}  // namespace
}  // namespace ballast::kernels
