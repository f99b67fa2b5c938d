#include "worker/train/model/load_balancing.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <vector>

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

Layers Route(double weight, uint64_t seed) {
  torch::manual_seed(seed);
  Layers out;
  out.stats = std::make_shared<RoutingStats>(/*num_layers=*/4, kExperts, kTopK, weight);
  for (int64_t layer : {1, 3}) {
    at::Tensor z = (2 * torch::randn({layer == 1 ? 17 : 11, kExperts}, torch::kDouble))
                       .requires_grad_(true);
    at::Tensor balanced = BalanceRouterLogits(z, out.stats);
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
  const at::Tensor w = layers.stats->ProbabilityGradient();
  // Activation checkpointing runs layer 3 again in backward, on the same input.
  torch::NoGradGuard no_grad;
  const at::Tensor p = torch::softmax(layers.logits[1], -1);
  layers.stats->Record(3, std::get<1>(torch::topk(p, kTopK, -1)), p, layers.logits[1]);
  EXPECT_EQ(layers.stats->AuxLoss().item<double>(), once);
  EXPECT_TRUE(torch::equal(layers.stats->ProbabilityGradient(), w));
}

TEST(LoadBalancing, ANoWeightOrNoGradForwardOnlyRecords) {
  const at::Tensor z = torch::randn({5, kExperts}).requires_grad_(true);
  auto measuring = std::make_shared<RoutingStats>(1, kExperts, kTopK, /*weight=*/0.0);
  EXPECT_TRUE(BalanceRouterLogits(z, measuring).is_same(z));
  auto weighted = std::make_shared<RoutingStats>(1, kExperts, kTopK, /*weight=*/1.0);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(BalanceRouterLogits(z, weighted).is_same(z));
  EXPECT_EQ(weighted->AuxLoss().item<float>(), 0.0f);  // nothing recorded
}

}  // namespace
}  // namespace ballast::train
