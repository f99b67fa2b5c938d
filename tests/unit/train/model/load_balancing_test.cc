#include "worker/train/model/load_balancing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "worker/train/model/step_routing.h"

namespace ballast::train {
namespace {

constexpr int64_t kExperts = 6;
constexpr int64_t kTopK = 2;

// The Switch loss over the layers' logits concatenated, as a float64 graph:
// f from the top-k (no gradient), P differentiable through the softmax.
at::Tensor SwitchLoss(const std::vector<at::Tensor>& logits) {
  const at::Tensor z = torch::cat(logits, 0);
  const at::Tensor p = torch::softmax(z, -1);
  const at::Tensor chosen = std::get<1>(torch::topk(p.detach(), kTopK, -1));
  const at::Tensor f = torch::one_hot(chosen, kExperts).to(torch::kDouble).mean(0);  // (k, E)
  return (f * p.mean(0).unsqueeze(0)).sum() * kExperts;
}

// Two sparse layers' routing of different token counts, recorded as a
// layer records it, in float64.
struct Layers {
  std::vector<at::Tensor> logits;
  std::shared_ptr<RoutingStats> stats;
  std::vector<at::Tensor> balanced;  // what BalanceRouterLogits gives the layers
};

// `tokens` rows in each layer (0: 17 in layer 1, 11 in layer 3); only the
// `counted` ones count, when given.
Layers Route(double weight, uint64_t seed, int64_t tokens = 0, const at::Tensor& counted = {}) {
  torch::manual_seed(seed);
  Layers out;
  out.stats = std::make_shared<RoutingStats>(/*num_layers=*/4, kExperts, kTopK, weight);
  if (counted.defined()) out.stats->set_counted(counted, counted.sum().item<int64_t>());
  for (int64_t layer : {1, 3}) {
    const int64_t rows = tokens > 0 ? tokens : (layer == 1 ? 17 : 11);
    at::Tensor z = (2 * torch::randn({rows, kExperts}, torch::kDouble)).requires_grad_(true);
    at::Tensor balanced = BalanceRouterLogits(z, out.stats, layer);
    const at::Tensor p = torch::softmax(balanced, -1);
    out.stats->Record(layer, std::get<1>(torch::topk(p, kTopK, -1)), p, balanced);
    out.logits.push_back(z);
    out.balanced.push_back(balanced);
  }
  return out;
}

TEST(LoadBalancing, AuxLossIsTheSwitchLossOverEveryLayersTokens) {
  Layers layers = Route(/*weight=*/0.5, /*seed=*/1);
  torch::NoGradGuard no_grad;
  EXPECT_NEAR(layers.stats->AuxLoss().item<double>(), SwitchLoss(layers.logits).item<double>(),
              1e-12);
}

TEST(LoadBalancing, TheIdentitysBackwardAddsTheLossGradient) {
  const double weight = 0.37;
  Layers layers = Route(weight, /*seed=*/2);
  // What arrives from the layers' outputs, plus the aux gradient.
  std::vector<at::Tensor> upstream;
  at::Tensor task = torch::zeros({}, torch::kDouble);
  for (const at::Tensor& b : layers.balanced) {
    upstream.push_back(torch::randn_like(b));
    task = task + (b * upstream.back()).sum();
  }
  layers.stats.reset();  // the graph keeps the stats alive
  task.backward();

  std::vector<at::Tensor> want_logits;
  for (const at::Tensor& z : layers.logits) {
    want_logits.push_back(z.detach().clone().requires_grad_(true));
  }
  (SwitchLoss(want_logits) * weight).backward();
  for (size_t i = 0; i < layers.logits.size(); ++i) {
    const at::Tensor want = want_logits[i].grad() + upstream[i];
    EXPECT_TRUE(torch::allclose(layers.logits[i].grad(), want, 1e-10, 1e-12)) << "layer " << i;
  }
}

TEST(LoadBalancing, ARecomputedLayerReplacesItsRecord) {
  Layers layers = Route(/*weight=*/1.0, /*seed=*/3);
  const double once = layers.stats->AuxLoss().item<double>();
  const at::Tensor w = layers.stats->ProbabilityGradient(3);
  // Activation checkpointing runs layer 3 again in backward, on the same input.
  torch::NoGradGuard no_grad;
  const at::Tensor p = torch::softmax(layers.logits[1], -1);
  layers.stats->Record(3, std::get<1>(torch::topk(p, kTopK, -1)), p, layers.logits[1]);
  EXPECT_EQ(layers.stats->AuxLoss().item<double>(), once);
  EXPECT_TRUE(torch::equal(layers.stats->ProbabilityGradient(3), w));
}

TEST(LoadBalancing, ANoWeightOrNoGradForwardOnlyRecords) {
  const at::Tensor z = torch::randn({5, kExperts}).requires_grad_(true);
  auto measuring = std::make_shared<RoutingStats>(1, kExperts, kTopK, /*weight=*/0.0);
  EXPECT_TRUE(BalanceRouterLogits(z, measuring, 0).is_same(z));
  auto weighted = std::make_shared<RoutingStats>(1, kExperts, kTopK, /*weight=*/1.0);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(BalanceRouterLogits(z, weighted, 0).is_same(z));
  EXPECT_EQ(weighted->AuxLoss().item<float>(), 0.0f);  // nothing recorded
}

// The aux loss's own gradient of each logit (nothing from upstream).
void BackwardAux(const Layers& f) {
  at::Tensor zero = torch::zeros({}, torch::kDouble);
  for (const at::Tensor& b : f.balanced) zero = zero + (b * 0).sum();
  zero.backward();
}

TEST(LoadBalancing, PerLayerScopeIsTheMeanOfTheLayersLosses) {
  const double weight = 0.6;
  Layers f = Route(weight, /*seed=*/4, /*tokens=*/13);
  f.stats->set_scope(AuxLossScope::kPerLayer);
  const double want_loss =
      ((SwitchLoss({f.logits[0]}) + SwitchLoss({f.logits[1]})) / 2).item<double>();
  EXPECT_NEAR(f.stats->AuxLoss().item<double>(), want_loss, 1e-12);
  BackwardAux(f);
  std::vector<at::Tensor> want;
  for (const at::Tensor& z : f.logits) want.push_back(z.detach().clone().requires_grad_(true));
  (weight * (SwitchLoss({want[0]}) + SwitchLoss({want[1]})) / 2).backward();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(torch::allclose(f.logits[i].grad(), want[i].grad(), 1e-10, 1e-12)) << i;
  }
}

// Global balancing: two micro-batches' gradients with the step's counts sum
// to the gradient of one Switch loss over both, and StepRouting's loss is it.
TEST(LoadBalancing, WithTheStepsCountsTheMicroBatchGradientsSumToTheStepLoss) {
  const double weight = 0.45;
  std::vector<Layers> micro = {Route(weight, /*seed=*/5, /*tokens=*/9),
                               Route(weight, /*seed=*/6, /*tokens=*/14)};
  StepRouting step({1, 3}, kExperts, kTopK);
  for (const Layers& f : micro) f.stats->AddTo(&step);
  for (const Layers& f : micro) {
    f.stats->UseStepCounts(step);
    BackwardAux(f);
  }
  std::vector<at::Tensor> want;
  for (const Layers& f : micro) {
    for (const at::Tensor& z : f.logits) want.push_back(z.detach().clone().requires_grad_(true));
  }
  const at::Tensor global = SwitchLoss(want);
  EXPECT_NEAR(step.AuxLoss(AuxLossScope::kAllLayers), global.item<double>(), 1e-12);
  (weight * global).backward();
  size_t i = 0;
  for (const Layers& f : micro) {
    for (const at::Tensor& z : f.logits) {
      EXPECT_TRUE(torch::allclose(z.grad(), want[i].grad(), 1e-10, 1e-12)) << i;
      ++i;
    }
  }
  // Without the step's counts, each micro-batch balances itself: another gradient.
  Layers alone = Route(weight, /*seed=*/5, /*tokens=*/9);
  BackwardAux(alone);
  EXPECT_FALSE(torch::allclose(alone.logits[0].grad(), micro[0].logits[0].grad(), 1e-6, 1e-9));
}

TEST(LoadBalancing, OnlyCountedTokensCountAndGetTheGradient) {
  const double weight = 0.8;
  torch::manual_seed(7);
  const at::Tensor counted = torch::rand({16}) < 0.5;
  Layers f = Route(weight, /*seed=*/8, /*tokens=*/16, counted);
  std::vector<at::Tensor> kept;
  for (const at::Tensor& z : f.logits) {
    kept.push_back(z.detach().index({counted}).clone().requires_grad_(true));
  }
  const at::Tensor want_loss = SwitchLoss(kept);
  EXPECT_NEAR(f.stats->AuxLoss().item<double>(), want_loss.item<double>(), 1e-12);
  BackwardAux(f);
  (weight * want_loss).backward();
  for (size_t i = 0; i < kept.size(); ++i) {
    const at::Tensor grad = f.logits[i].grad();
    EXPECT_TRUE(torch::allclose(grad.index({counted}), kept[i].grad(), 1e-10, 1e-12)) << i;
    EXPECT_EQ(grad.index({~counted}).abs().max().item<double>(), 0.0) << i;
  }
}

}  // namespace
}  // namespace ballast::train
