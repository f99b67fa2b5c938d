#include "worker/train/checkpoint/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "worker/train/io/file_tree.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/optim/lr_schedule.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "checkpoint_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    params_.Add("w", torch::randn({3, 4}), ParamStore::kNoLayer, /*trainable=*/true);
    params_.Add("frozen", torch::randn({2}), ParamStore::kNoLayer, /*trainable=*/false);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  std::string dir_;
  ParamStore params_;
};

TEST_F(CheckpointTest, RoundTripsParamsOptimizerRngAndPosition) {
  AdamW opt({}, params_);
  params_.get("w").mutable_grad() = torch::randn({3, 4});
  opt.Step(params_, 1e-2);
  ASSERT_TRUE(SaveCheckpoint(dir_, {3, 24}, params_, opt, CheckpointHealth::kGood).ok());
  const at::Tensor saved_w = params_.get("w").detach().clone();
  const at::Tensor next_draw = torch::rand({8});  // what the RNG gives after the save

  ParamStore restored;
  restored.Add("w", torch::zeros({3, 4}), ParamStore::kNoLayer, true);
  restored.Add("frozen", torch::zeros({2}), ParamStore::kNoLayer, false);
  AdamW restored_opt({}, restored);
  std::optional<std::string> latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.has_value());
  absl::StatusOr<TrainPosition> pos = LoadCheckpoint(*latest, &restored, &restored_opt);
  ASSERT_TRUE(pos.ok()) << pos.status();
  EXPECT_EQ(pos->step, 3);
  EXPECT_EQ(pos->data_cursor, 24);
  EXPECT_TRUE(torch::equal(restored.get("w"), saved_w));
  EXPECT_EQ(restored_opt.steps(), 1);
  EXPECT_TRUE(torch::equal(restored_opt.StateDict()["w.exp_avg"], opt.StateDict()["w.exp_avg"]));
  EXPECT_TRUE(torch::equal(torch::rand({8}), next_draw));
}

// Early stopping's progress is part of the position: a resumed run judges
// its next evaluation as the run it continues would have. A fresh random
// best value comes back to the bit.
TEST_F(CheckpointTest, RoundTripsTheEvaluationsProgress) {
  AdamW opt({}, params_);
  TrainPosition position{.step = 9, .data_cursor = 36};
  const double best = torch::rand({1}, torch::kDouble).item<double>() * 10;
  position.eval = {.evaluations = 4, .best_step = 6, .best_value = best, .since_best = 1};
  ASSERT_TRUE(SaveCheckpoint(dir_, position, params_, opt, CheckpointHealth::kGood).ok());
  ASSERT_TRUE(SaveCheckpoint(dir_, {12, 48}, params_, opt, CheckpointHealth::kGood).ok());
  absl::StatusOr<TrainPosition> with = LoadCheckpoint(*LatestCheckpoint(dir_, 9), &params_, &opt);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->eval, position.eval);
  // None yet: the defaults, best_step -1.
  absl::StatusOr<TrainPosition> without = LoadCheckpoint(*LatestCheckpoint(dir_), &params_, &opt);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ(without->eval, EvalProgress());
  EXPECT_EQ(without->eval.best_step, -1);
}

TEST_F(CheckpointTest, RefusesToWriteNonFiniteParams) {
  AdamW opt({}, params_);
  {
    torch::NoGradGuard no_grad;
    params_.get("w")[1][2] = std::numeric_limits<float>::quiet_NaN();
  }
  absl::Status s = SaveCheckpoint(dir_, {5, 0}, params_, opt, CheckpointHealth::kGood).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("w is not finite"));
  EXPECT_FALSE(LatestCheckpoint(dir_).has_value());
}

TEST_F(CheckpointTest, LatestIgnoresAndRemovesInterruptedSaves) {
  AdamW opt({}, params_);
  ASSERT_TRUE(SaveCheckpoint(dir_, {5, 0}, params_, opt, CheckpointHealth::kGood).ok());
  ASSERT_TRUE(SaveCheckpoint(dir_, {10, 0}, params_, opt, CheckpointHealth::kGood).ok());
  fs::create_directories(fs::path(dir_) / ".step-00000015.tmp");
  std::optional<std::string> latest = LatestCheckpoint(dir_);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "step-00000010");
  EXPECT_FALSE(fs::exists(fs::path(dir_) / ".step-00000015.tmp"));
}

TEST(LearningRateSchedule, MatchesTransformersFormulas) {
  // Warmup is linear from 0; cosine is a half period to 0; linear decays to 0.
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("cosine", 1.0, 0, 4, 20), 0.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("cosine", 1.0, 2, 4, 20), 0.5);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("cosine", 1.0, 4, 4, 20), 1.0);
  EXPECT_NEAR(ScheduledLearningRate("cosine", 1.0, 12, 4, 20), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("linear", 2.0, 12, 4, 20), 1.0);
  EXPECT_DOUBLE_EQ(ScheduledLearningRate("constant", 3.0, 19, 4, 20), 3.0);
}

}  // namespace
}  // namespace ballast::train
