// The reranker objective through the whole (tiny) model against a float64
// reference written from the formulas (shared/REFERENCES.md): Δ from the
// full logits at each candidate's last token, then the listwise
// cross-entropy over each group's scores / τ, or BCE on Δ.
#include "worker/train/objective/generative_reranker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <random>

#include "tests/unit/train/tiny_model.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/model/pretrained.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kYes = 5, kNo = 7;

class GenerativeRerankerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "reranker_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    const std::string model = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/3);
    absl::StatusOr<ModelConfig> config = LoadModelConfig(model);
    ASSERT_TRUE(config.ok());
    config_ = *config;
    absl::StatusOr<ParamStore> params = LoadPretrained(model, config_, /*trainable=*/true);
    ASSERT_TRUE(params.ok()) << params.status();
    params_ = *std::move(params);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  // Groups of the given sizes, candidates of 3..12 random tokens, the
  // positive first in each group.
  PackedBatch Batch(const std::vector<int64_t>& group_sizes) {
    std::mt19937 rng(std::random_device{}());
    std::vector<int64_t> ids, positions, cu = {0}, offsets = {0};
    std::vector<float> relevance;
    for (const int64_t size : group_sizes) {
      for (int64_t k = 0; k < size; ++k) {
        const int64_t n = 3 + rng() % 10;
        for (int64_t t = 0; t < n; ++t) {
          ids.push_back(rng() % TinyModel::kVocab);
          positions.push_back(t);
        }
        cu.push_back(cu.back() + n);
        relevance.push_back(k == 0 ? 1.0f : 0.0f);
      }
      offsets.push_back(offsets.back() + size);
    }
    PackedBatch b;
    b.input_ids = torch::tensor(ids, torch::kLong);
    b.position_ids = torch::tensor(positions, torch::kLong);
    b.cu_seqlens = torch::tensor(cu, torch::kLong);
    b.targets = torch::full({static_cast<int64_t>(ids.size())}, -100, torch::kLong);
    b.group_offsets = torch::tensor(offsets, torch::kLong);
    b.relevance = torch::tensor(relevance, torch::kFloat);
    return b;
  }

  // Δ in float64 from the full logits.
  at::Tensor ReferenceDiff(const Decoder& decoder, const PackedBatch& b) {
    torch::NoGradGuard no_grad;
    const at::Tensor logits = decoder.Logits(b).to(torch::kDouble);
    const at::Tensor last = b.cu_seqlens.slice(0, 1) - 1;
    return logits.index({last, kYes}) - logits.index({last, kNo});
  }

  std::string dir_;
  ModelConfig config_;
  ParamStore params_;
};

TEST_F(GenerativeRerankerTest, ListwiseAndPointwiseMatchTheFormulasThroughTheModel) {
  Decoder decoder(config_, &params_, std::nullopt, torch::kFloat, false);
  const PackedBatch b = Batch({3, 1, 4, 2});
  const at::Tensor diff = ReferenceDiff(decoder, b);
  const at::Tensor offsets = b.group_offsets;
  for (const auto score :
       {kernels::RerankerScore::kLogitDiff, kernels::RerankerScore::kLogSigmoid}) {
    const double tau = 0.5;
    GenerativeReranker listwise(
        {.yes_id = kYes, .no_id = kNo, .listwise = true, .score = score, .temperature = tau});
    double want = 0;
    int64_t groups = 0;
    for (int64_t g = 0; g + 1 < offsets.numel(); ++g) {
      const int64_t begin = offsets[g].item<int64_t>(), end = offsets[g + 1].item<int64_t>();
      if (end - begin < 2) continue;  // a group without a negative teaches nothing
      at::Tensor s = diff.slice(0, begin, end);
      if (score == kernels::RerankerScore::kLogSigmoid) s = torch::log_sigmoid(s);
      const at::Tensor x = s / tau;
      want += (-x[0] + torch::logsumexp(x, 0)).item<double>();
      ++groups;
    }
    const kernels::LossSum got = listwise.Loss(decoder, b, false);
    EXPECT_EQ(got.count.item<int64_t>(), groups);
    EXPECT_EQ(listwise.Targets(b), groups);
    EXPECT_NEAR(got.sum.item<double>(), want, 1e-4 * std::abs(want));
  }
  GenerativeReranker pointwise({.yes_id = kYes, .no_id = kNo, .listwise = false});
  const at::Tensor y = b.relevance.to(torch::kDouble);
  const double want = (torch::clamp_min(diff, 0) - diff * y + torch::log1p(torch::exp(-diff.abs())))
                          .sum()
                          .item<double>();
  const kernels::LossSum got = pointwise.Loss(decoder, b, false);
  EXPECT_EQ(got.count.item<int64_t>(), 10);
  EXPECT_EQ(pointwise.Targets(b), 10);
  EXPECT_NEAR(got.sum.item<double>(), want, 1e-4 * std::abs(want));
}

TEST_F(GenerativeRerankerTest, YesAndNoLogitsAtTenThousandKeepTheLossAndGradientsFinite) {
  // The yes row pushed far out: Δ near ±1e4 at every candidate.
  params_.get("lm_head.weight").data()[kYes].mul_(1e4 / 3);
  Decoder decoder(config_, &params_, std::nullopt, torch::kFloat, false);
  const PackedBatch b = Batch({4, 3});
  ASSERT_GT(ReferenceDiff(decoder, b).abs().max().item<double>(), 100);
  for (const bool listwise : {true, false}) {
    GenerativeReranker objective({.yes_id = kYes, .no_id = kNo, .listwise = listwise});
    const kernels::LossSum loss = objective.Loss(decoder, b, true);
    ASSERT_TRUE(std::isfinite(loss.sum.item<double>()));
    loss.sum.backward();
    for (const std::string& name : params_.TrainableNames()) {
      const at::Tensor grad = params_.get(name).grad();
      if (!grad.defined()) continue;
      EXPECT_TRUE(torch::isfinite(grad).all().item<bool>()) << name;
      params_.get(name).mutable_grad().reset();
    }
  }
}

}  // namespace
}  // namespace ballast::train
