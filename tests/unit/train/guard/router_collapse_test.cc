// The router-collapse check, on synthetic per-layer expert counts: a healthy
// top-k router (fresh random logits each step) never trips it, a forced
// collapse does after collapse_window steps; and the layer stats it reads
// (model/moe_step_stats.h) against their definitions.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "worker/train/guard/guard.h"
#include "worker/train/model/moe_step_stats.h"

namespace ballast::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kExperts = 16;
constexpr int64_t kTopK = 2;
constexpr int64_t kTokens = 512;

// One layer's routing of kTokens tokens by a top-k softmax router whose
// logits are drawn N(bias_e, 1): a zero bias is a healthy router. The entropy
// is the router's own, summed over tokens.
LayerRouting RouteTokens(int64_t layer, const std::vector<double>& bias, std::mt19937_64& rng) {
  LayerRouting routing{.layer = layer, .load = std::vector<double>(kExperts, 0.0)};
  std::normal_distribution<double> normal;
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<double> p(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) p[e] = bias[e] + normal(rng);
    const double top = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (double& v : p) sum += (v = std::exp(v - top));
    for (double& v : p) v /= sum;
    std::vector<int64_t> order(kExperts);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + kTopK, order.end(),
                      [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    for (int64_t j = 0; j < kTopK; ++j) routing.load[order[j]] += 1;
    for (double v : p) routing.entropy_sum -= v > 0 ? v * std::log(v) : 0;
    routing.tokens += 1;
  }
  return routing;
}

// A step of a two-layer MoE model; layer 1 sends nearly every token to
// experts 3 and 11 when `collapsed`.
StepHealth MoeStep(int64_t step, bool collapsed, std::mt19937_64& rng) {
  StepHealth h;
  h.step = step;
  h.loss = 2.0 + 0.01 * static_cast<double>(step % 7);
  h.grad_norm = 0.5 + 0.01 * static_cast<double>(step % 5);
  std::vector<double> healthy(kExperts, 0.0), skewed(kExperts, 0.0);
  skewed[3] = skewed[11] = 8.0;
  const std::vector<LayerRouting> layers = {RouteTokens(0, healthy, rng),
                                            RouteTokens(1, collapsed ? skewed : healthy, rng)};
  h.moe = SummarizeStepRouting(layers, kTopK, /*aux_loss=*/1.0);
  return h;
}

GuardVerdict JudgeAndAct(Guard& guard, const StepHealth& health) {
  GuardVerdict v = guard.Judge(health);
  guard.Acted(v, health);
  return v;
}

class RouterCollapseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }
  std::mt19937_64 rng_;
  uint64_t seed_ = 0;
};

TEST_F(RouterCollapseTest, HealthyRoutingNeverTripsIt) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  Guard guard(GuardOptions{.collapse_window = 5, .moe_collapse_share = 0.5});
  for (int64_t step = 1; step <= 40; ++step) {
    const StepHealth h = MoeStep(step, /*collapsed=*/false, rng_);
    // A balanced top-2 of 16 puts about 2/16 of the pairs on its busiest 2.
    for (const MoeLayerStats& layer : h.moe->layers) {
      EXPECT_LT(layer.top_k_share, 0.25) << "layer " << layer.layer;
    }
    const GuardVerdict v = JudgeAndAct(guard, h);
    ASSERT_EQ(v.action, GuardAction::kApply) << "step " << step << ": " << v.reason;
  }
}

TEST_F(RouterCollapseTest, AForcedCollapseRollsBackAfterTheWindowNamingTheLayer) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  Guard guard(GuardOptions{.collapse_window = 4});  // the default share, 0.9
  EXPECT_EQ(JudgeAndAct(guard, MoeStep(1, false, rng_)).action, GuardAction::kApply);
  for (int64_t step = 2; step <= 4; ++step) {
    const StepHealth h = MoeStep(step, /*collapsed=*/true, rng_);
    EXPECT_GT(h.moe->layers[1].top_k_share, 0.9);
    EXPECT_EQ(JudgeAndAct(guard, h).action, GuardAction::kApply) << "step " << step;
  }
  const GuardVerdict v = JudgeAndAct(guard, MoeStep(5, /*collapsed=*/true, rng_));
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_EQ(v.trigger, GuardTrigger::kRouterCollapse);
  EXPECT_STREQ(TriggerName(v.trigger), "router_collapse");
  EXPECT_EQ(v.episode_start, 2);
  EXPECT_THAT(v.reason, HasSubstr("router collapse: for 4 steps a MoE layer's 2 busiest experts "
                                  "took more than 0.9 of its routed (token, choice) pairs"));
  EXPECT_THAT(v.reason, HasSubstr("layer 1, experts "));
  EXPECT_THAT(v.reason, HasSubstr("of the 16 experts idle"));
  // The run starts over after the rollback.
  EXPECT_EQ(JudgeAndAct(guard, MoeStep(6, true, rng_)).action, GuardAction::kApply);
}

TEST_F(RouterCollapseTest, AnInterruptedCollapseOrAnOffSwitchDoesNotTripIt) {
  SCOPED_TRACE(testing::Message() << "seed " << seed_);
  Guard guard(GuardOptions{.collapse_window = 3});
  for (int64_t step = 1; step <= 12; ++step) {
    // Two collapsed steps, then a healthy one: never three in a row.
    EXPECT_EQ(JudgeAndAct(guard, MoeStep(step, step % 3 != 0, rng_)).action, GuardAction::kApply)
        << "step " << step;
  }
  for (const GuardOptions& off : {GuardOptions{.collapse_window = 0},
                                  GuardOptions{.collapse_window = 2, .moe_collapse_share = 0}}) {
    Guard quiet(off);
    for (int64_t step = 1; step <= 6; ++step) {
      EXPECT_EQ(JudgeAndAct(quiet, MoeStep(step, true, rng_)).action, GuardAction::kApply);
    }
  }
  // With k = E every token reaches every expert: nothing to collapse.
  Guard all(GuardOptions{.collapse_window = 1});
  StepHealth h = MoeStep(1, true, rng_);
  h.moe->top_k = h.moe->num_experts;
  EXPECT_EQ(all.Judge(h).action, GuardAction::kApply);
}

TEST(MoeStepStats, LayerStatsFollowTheirDefinitions) {
  // 4 tokens, top-2, 5 experts: loads 4, 2, 2, 0, 0 (8 pairs).
  const LayerRouting routing{.layer = 7, .load = {2, 4, 0, 2, 0}, .tokens = 4, .entropy_sum = 2.0};
  const MoeLayerStats s = SummarizeLayerRouting(routing, /*top_k=*/2);
  EXPECT_EQ(s.layer, 7);
  EXPECT_DOUBLE_EQ(s.max_load_ratio, 4.0 / (8.0 / 5.0));
  EXPECT_DOUBLE_EQ(s.idle_expert_fraction, 2.0 / 5.0);
  EXPECT_DOUBLE_EQ(s.router_entropy, 0.5);
  EXPECT_DOUBLE_EQ(s.top_k_share, 6.0 / 8.0);
  EXPECT_THAT(s.busiest_experts, ElementsAre(1, 0));  // a tie goes to the lower index

  const MoeLayerStats idle =
      SummarizeLayerRouting(LayerRouting{.load = std::vector<double>(3, 0.0)}, 2);
  EXPECT_EQ(idle.max_load_ratio, 0);
  EXPECT_EQ(idle.top_k_share, 0);
  EXPECT_EQ(idle.idle_expert_fraction, 1);

  const MoeStepStats step = SummarizeStepRouting(
      {routing, LayerRouting{.layer = 9, .load = {2, 2, 2, 1, 1}, .tokens = 4}}, 2, 0.25);
  EXPECT_EQ(step.num_experts, 5);
  EXPECT_EQ(step.aux_loss, 0.25);
  EXPECT_DOUBLE_EQ(MaxLoadRatio(step), 2.5);
}

}  // namespace
}  // namespace ballast::train
