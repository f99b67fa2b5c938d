#include "worker/train/optim/adamw.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "worker/train/optim/lr_schedule.h"

namespace ballast::train {
namespace {

// torch.optim.AdamW's update (amsgrad=False), element by element in fp64,
// exactly as its documentation writes it.
struct ReferenceAdamW {
  AdamWConfig c;
  std::vector<double> p, m, v;
  int64_t t = 0;

  void Step(const std::vector<double>& g, double lr) {
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1 - lr * c.weight_decay;
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g[i];
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g[i] * g[i];
      const double m_hat = m[i] / (1 - std::pow(c.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(c.beta2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + c.eps);
    }
  }
};

std::vector<double> ToVector(const at::Tensor& t) {
  at::Tensor d = t.detach().to(torch::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

TEST(AdamW, MatchesTorchsAdamWFormulaInFp64OverSeveralSteps) {
  const AdamWConfig config{.beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.1};
  ParamStore params;
  params.Add("w", torch::randn({5, 7}), ParamStore::kNoLayer, /*trainable=*/true);
  params.Add("frozen", torch::randn({3}), ParamStore::kNoLayer, /*trainable=*/false);
  const at::Tensor frozen = params.get("frozen").clone();
  ReferenceAdamW ref{config, ToVector(params.get("w")), std::vector<double>(35, 0),
                     std::vector<double>(35, 0)};
  AdamW opt(config, params);
  for (double lr : {1e-2, 3e-3, 5e-2, 1e-3}) {
    at::Tensor g = torch::randn({5, 7});
    params.get("w").mutable_grad() = g;
    opt.Step(params, lr);
    ref.Step(ToVector(g), lr);
  }
  EXPECT_EQ(opt.steps(), 4);
  const std::vector<double> got = ToVector(params.get("w"));
  // fp32 state and parameters against fp64: a few ulps of fp32 per step.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], ref.p[i], 1e-5) << i;
  EXPECT_TRUE(torch::equal(params.get("frozen"), frozen));
}

TEST(AdamW, LeavesATrainableTensorWithoutAGradientAsItIs) {
  ParamStore params;
  params.Add("a", torch::randn({4}), ParamStore::kNoLayer, true);
  params.Add("b", torch::randn({4}), ParamStore::kNoLayer, true);
  const at::Tensor b = params.get("b").clone();
  AdamW opt({}, params);
  params.get("a").mutable_grad() = torch::ones({4});
  opt.Step(params, 0.1);
  EXPECT_TRUE(torch::equal(params.get("b"), b));
  EXPECT_EQ(opt.StateDict()["b.exp_avg"].abs().sum().item<float>(), 0.0f);
}

TEST(AdamW, RefusesAStateDictWithAMissingOrMisshapenMoment) {
  ParamStore params;
  params.Add("w", torch::randn({4}), ParamStore::kNoLayer, true);
  AdamW opt({}, params);
  std::map<std::string, at::Tensor> state = opt.StateDict();
  state["w.exp_avg"] = torch::zeros({5});
  absl::Status s = opt.LoadStateDict(state);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("w.exp_avg"));
  state.erase("__step__");
  EXPECT_EQ(opt.LoadStateDict(state).code(), absl::StatusCode::kDataLoss);
}

TEST(LrSchedule, LinearDecaysToZeroAtMaxStepsAfterWarmup) {
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 1.0, 0, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 1.0, 1, 2, 10), 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 1.0, 2, 2, 10), 1.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 1.0, 6, 2, 10), 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 1.0, 10, 2, 10), 0.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("constant", 0.3, 7, 0, 10), 0.3);
}

}  // namespace
}  // namespace ballast::train
