#include "worker/train/model/routing_bias.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/train/model/decoder.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/load_balancing.h"
#include "worker/train/model/sparse_moe.h"
#include "worker/train/model/step_routing.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kExperts = 6;
constexpr int64_t kTopK = 2;
constexpr int64_t kHidden = 16;
constexpr int64_t kWidth = 8;  // each expert's SwiGLU width
constexpr int64_t kTokens = 40;

// One sparse layer (layer 0) of random experts and router, fp32.
struct MoeLayer {
  ModelConfig config;
  ParamStore params;
};

MoeLayer MakeLayer(bool norm_topk_prob, uint64_t seed) {
  torch::manual_seed(seed);
  MoeLayer m;
  ModelConfig& c = m.config;
  c.model_type = "qwen3_moe";
  c.hidden_size = kHidden;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.rotary_dim = 8;
  c.moe.num_experts = kExperts;
  c.moe.top_k = kTopK;
  c.moe.moe_intermediate_size = kWidth;
  c.moe.norm_topk_prob = norm_topk_prob;
  m.params.Add(LayerPrefix(0) + "mlp.gate.weight", torch::randn({kExperts, kHidden}), 0, true);
  m.params.Add(ExpertsPrefix(0) + "gate_up_proj",
               0.3 * torch::randn({kExperts, 2 * kWidth, kHidden}), 0, true);
  m.params.Add(ExpertsPrefix(0) + "down_proj", 0.3 * torch::randn({kExperts, kHidden, kWidth}), 0,
               true);
  return m;
}

// The layer in float64 with the choice topk(p + bias) and the weights p
// (renormalised when the config says so): (T, H).
at::Tensor ReferenceMoe(const MoeLayer& m, const at::Tensor& x, const at::Tensor& bias) {
  const at::Tensor x64 = x.to(torch::kDouble);
  const at::Tensor router = m.params.get(LayerPrefix(0) + "mlp.gate.weight").to(torch::kDouble);
  const at::Tensor gate_up = m.params.get(ExpertsPrefix(0) + "gate_up_proj").to(torch::kDouble);
  const at::Tensor down = m.params.get(ExpertsPrefix(0) + "down_proj").to(torch::kDouble);
  const at::Tensor p = torch::softmax(torch::matmul(x64, router.t()), -1);
  const at::Tensor chosen = std::get<1>(torch::topk(p + bias.to(torch::kDouble), kTopK, -1));
  at::Tensor w = p.gather(-1, chosen);
  if (m.config.moe.norm_topk_prob) w = w / w.sum(-1, true);
  at::Tensor out = torch::zeros_like(x64);
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t j = 0; j < kTopK; ++j) {
      const int64_t e = chosen[t][j].item<int64_t>();
      const at::Tensor h = torch::matmul(gate_up[e], x64[t]);  // (2I)
      const at::Tensor act = torch::silu(h.narrow(0, 0, kWidth)) * h.narrow(0, kWidth, kWidth);
      out[t] += w[t][j] * torch::matmul(down[e], act);
    }
  }
  return out;
}

// With a large bias on one expert, every token chooses it; the weights are
// the unbiased probabilities of the chosen experts (renormalised with
// norm_topk_prob), never the biased scores. Small random biases on the rest
// decide the second choice as p + b orders it.
TEST(RoutingBias, SteersTheChoiceButNotTheWeights) {
  for (bool norm : {true, false}) {
    MoeLayer m = MakeLayer(norm, /*seed=*/norm ? 3 : 4);
    RoutingBias bias({0}, kExperts, /*rate=*/0.001, c10::kCPU);
    at::Tensor b = 0.05 * torch::randn({kExperts});
    b[4] = 5.0;  // beyond any probability difference
    ASSERT_TRUE(bias.Restore({{RoutingBias::TensorName(0), b}}).ok());

    Decoder decoder(m.config, &m.params, std::nullopt, torch::kFloat, false);
    decoder.set_routing_bias(&bias);
    auto stats = std::make_shared<RoutingStats>(1, kExperts, kTopK, /*weight=*/0);
    decoder.set_routing(stats);
    const at::Tensor x = torch::randn({kTokens, kHidden});
    at::Tensor got;
    {
      torch::NoGradGuard no_grad;
      got = SparseMoe(decoder, 0, x, /*training=*/false);
    }
    // Expert 4 is every token's choice, as the routing records it.
    EXPECT_EQ(stats->counts()[0].sum(0)[4].item<int64_t>(), kTokens) << norm;

    const at::Tensor want = ReferenceMoe(m, x, b);
    EXPECT_LT((got.to(torch::kDouble) - want).abs().max().item<double>(),
              1e-5 * want.abs().max().item<double>())
        << "norm_topk_prob " << norm;
    // The check can fail: weighting by the biased scores, or routing
    // without the bias, gives another output.
    const at::Tensor unbiased = ReferenceMoe(m, x, torch::zeros({kExperts}));
    EXPECT_GT((want - unbiased).abs().max().item<double>(), 1e-2);
  }
}

// The router's gradient still flows through the unbiased weights.
TEST(RoutingBias, TheRouterGetsAGradientThroughTheWeights) {
  MoeLayer m = MakeLayer(/*norm_topk_prob=*/false, /*seed=*/5);
  RoutingBias bias({0}, kExperts, 0.001, c10::kCPU);
  Decoder decoder(m.config, &m.params, std::nullopt, torch::kFloat, false);
  decoder.set_routing_bias(&bias);
  const at::Tensor& router = m.params.get(LayerPrefix(0) + "mlp.gate.weight");
  router.requires_grad_(true);
  SparseMoe(decoder, 0, torch::randn({kTokens, kHidden}), false).sum().backward();
  ASSERT_TRUE(router.grad().defined());
  EXPECT_GT(router.grad().abs().sum().item<double>(), 0);
}

// The update b_e += rate * sign(mean load - load_e) over the step's counts,
// summed over the choice slots, layer by layer, in fp32; an expert exactly
// at the mean keeps its bias.
TEST(RoutingBias, UpdateMovesEachBiasAgainstItsLoad) {
  const double rate = 0.01;
  RoutingBias bias({1, 3}, 4, rate, c10::kCPU);
  std::vector<double> want1(4, 0.0), want3(4, 0.0);
  torch::manual_seed(9);
  for (int step = 0; step < 3; ++step) {
    StepRouting routing({1, 3}, 4, /*top_k=*/2);
    // Layer 1: loads (k = 2 slots summed) 10, 2, 6, 6 -> mean 6.
    routing.Add(1, torch::tensor({{6, 1, 2, 3}, {4, 1, 4, 3}}, torch::kLong), torch::rand({4}),
                torch::tensor(12.0), torch::tensor(1.0));
    // Layer 3: random loads of 20 tokens.
    const at::Tensor choices = torch::randint(0, 10, {2, 4}, torch::kLong);
    routing.Add(3, choices, torch::rand({4}), torch::tensor(20.0), torch::tensor(1.0));
    bias.Update(routing);
    const std::vector<double> load1 = {10, 2, 6, 6};
    for (int e = 0; e < 4; ++e) {
      want1[e] = static_cast<float>(want1[e] + (load1[e] < 6 ? rate : load1[e] > 6 ? -rate : 0));
    }
    const at::Tensor load3 = choices.sum(0).to(torch::kDouble);
    const double mean3 = load3.mean().item<double>();
    for (int e = 0; e < 4; ++e) {
      const double l = load3[e].item<double>();
      want3[e] = static_cast<float>(want3[e] + static_cast<float>(l < mean3   ? rate
                                                                  : l > mean3 ? -rate
                                                                              : 0));
    }
  }
  for (int e = 0; e < 4; ++e) {
    EXPECT_FLOAT_EQ(bias.of(1)[e].item<float>(), static_cast<float>(want1[e])) << e;
    EXPECT_FLOAT_EQ(bias.of(3)[e].item<float>(), static_cast<float>(want3[e])) << e;
  }
  EXPECT_FLOAT_EQ(bias.of(1)[2].item<float>(), 0.0f);
  EXPECT_FLOAT_EQ(bias.of(1)[0].item<float>(), static_cast<float>(-3 * rate));
  EXPECT_FALSE(bias.of(0).defined());
  EXPECT_FALSE(bias.of(2).defined());
}

// Tensors() by HF DeepSeek-V3's names round-trips through Restore, which
// names what is missing or misshapen.
TEST(RoutingBias, TensorsRoundTripAndRestoreNamesWhatIsWrong) {
  RoutingBias a({1, 3}, 4, 0.1, c10::kCPU);
  StepRouting routing({1, 3}, 4, 1);
  routing.Add(1, torch::tensor({{5, 1, 1, 1}}, torch::kLong), torch::rand({4}), torch::tensor(8.0),
              torch::tensor(1.0));
  routing.Add(3, torch::tensor({{1, 1, 1, 5}}, torch::kLong), torch::rand({4}), torch::tensor(8.0),
              torch::tensor(1.0));
  a.Update(routing);
  const std::map<std::string, at::Tensor> saved = a.Tensors();
  ASSERT_EQ(saved.size(), 2u);
  ASSERT_TRUE(saved.count("model.layers.3.mlp.gate.e_score_correction_bias"));

  RoutingBias b({1, 3}, 4, 0.1, c10::kCPU);
  ASSERT_TRUE(b.Restore(saved).ok());
  EXPECT_TRUE(torch::equal(b.of(1), a.of(1)));
  EXPECT_TRUE(torch::equal(b.of(3), a.of(3)));

  std::map<std::string, at::Tensor> missing = saved;
  missing.erase("model.layers.1.mlp.gate.e_score_correction_bias");
  absl::Status s = b.Restore(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("no model.layers.1.mlp.gate.e_score_correction_bias"));

  std::map<std::string, at::Tensor> misshapen = saved;
  misshapen["model.layers.3.mlp.gate.e_score_correction_bias"] = torch::zeros({5});
  s = b.Restore(misshapen);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("model.layers.3.mlp.gate.e_score_correction_bias has shape "
                                     "[5]; expected [4]"));
}

}  // namespace
}  // namespace ballast::train
