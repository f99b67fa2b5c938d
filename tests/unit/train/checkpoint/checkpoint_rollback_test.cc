// KeepCheckpointsAtOrBefore: what `ballast-train --resume-at-or-before N`
// (a rollback, or a restart after one) resumes from; and the health marks
// that keep resume and rotation to good checkpoints.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/str_format.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/checkpoint/checkpoint_reader.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/optim/adamw.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class CheckpointRollbackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "checkpoint_rollback.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    params_.Add("w", torch::randn({2, 2}), ParamStore::kNoLayer, /*trainable=*/true);
    AdamW opt({}, params_);
    for (int64_t step : {5, 10, 15}) {
      absl::StatusOr<std::string> saved =
          SaveCheckpoint(dir_, {step, step * 2}, params_, opt, CheckpointHealth::kGood);
      ASSERT_TRUE(saved.ok()) << saved.status();
      EXPECT_EQ(fs::path(*saved).filename(), fs::path(absl::StrFormat("step-%08d", step)));
    }
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Saves step `step` as not yet good.
  std::string SaveUnverified(int64_t step) {
    AdamW opt({}, params_);
    absl::StatusOr<std::string> saved =
        SaveCheckpoint(dir_, {step, step * 2}, params_, opt, CheckpointHealth::kUnverified);
    EXPECT_TRUE(saved.ok()) << saved.status();
    return saved.ok() ? *saved : "";
  }

  std::string dir_;
  ParamStore params_;
};

TEST_F(CheckpointRollbackTest, ResumePassesByACheckpointThatIsNotYetGood) {
  const std::string step20 = SaveUnverified(20);
  EXPECT_FALSE(IsGoodCheckpoint(step20));
  EXPECT_EQ(fs::path(*LatestCheckpoint(dir_)).filename(), "step-00000015");
  EXPECT_EQ(fs::path(*LatestCheckpoint(dir_, 12)).filename(), "step-00000010");
  ASSERT_TRUE(MarkCheckpointGood(step20).ok());
  EXPECT_TRUE(IsGoodCheckpoint(step20));
  EXPECT_EQ(fs::path(*LatestCheckpoint(dir_)).filename(), "step-00000020");
}

TEST_F(CheckpointRollbackTest, RotationNeverDeletesTheNewestGoodCheckpoint) {
  SaveUnverified(20);
  SaveUnverified(25);
  ASSERT_TRUE(RotateCheckpoints(dir_, 2).ok());
  // The two newest, and 15: the newest good one, older than both.
  EXPECT_EQ(Names(), (std::vector<std::string>{"step-00000015", "step-00000020", "step-00000025"}));
  ASSERT_TRUE(RotateCheckpoints(dir_, 0).ok());  // 0 keeps all
  EXPECT_EQ(Names().size(), 3u);
}

TEST_F(CheckpointRollbackTest, RotationNeverDeletesTheBestEvaluationsCheckpoint) {
  SaveUnverified(20);
  SaveUnverified(25);
  ASSERT_TRUE(RotateCheckpoints(dir_, 1, /*best_steps=*/{10}).ok());
  // The newest, the newest good one (15), and 10, the best evaluation's.
  EXPECT_EQ(Names(), (std::vector<std::string>{"step-00000010", "step-00000015", "step-00000025"}));
}

// A rollback or a restart to a kept checkpoint puts its evaluations'
// progress back, and with it the best it names as the one to export.
TEST_F(CheckpointRollbackTest, RotationKeepsTheBestThatAKeptCheckpointNames) {
  AdamW opt({}, params_);
  for (const TrainPosition& position :
       {TrainPosition{20, 40, {.evaluations = 2, .best_step = 5, .best_value = 1.5}},
        TrainPosition{25, 50, {.evaluations = 3, .best_step = 20, .best_value = 1.25}}}) {
    ASSERT_TRUE(SaveCheckpoint(dir_, position, params_, opt, CheckpointHealth::kGood).ok());
  }
  // The run's best is now 25's evaluation (10 is no one's): 25 is the
  // newest, and it names 20, which names 5.
  ASSERT_TRUE(RotateCheckpoints(dir_, 1, /*best_steps=*/{25}).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"step-00000005", "step-00000020", "step-00000025"}));
  absl::StatusOr<TrainPosition> named = ReadCheckpointPosition(dir_ + "/step-00000020");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->eval.best_step, 5);
  EXPECT_EQ(named->eval.best_value, 1.5);
  // A folder whose state.json is unreadable names nothing, and is rotated
  // as any other.
  std::ofstream(dir_ + "/step-00000025/state.json") << "{not json";
  ASSERT_TRUE(RotateCheckpoints(dir_, 1).ok());
  EXPECT_EQ(Names(), (std::vector<std::string>{"step-00000025"}));
  EXPECT_EQ(ReadCheckpointPosition(dir_ + "/step-00000025").status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointRollbackTest, ANonFiniteStateIsNeverWritten) {
  AdamW opt({}, params_);
  {
    torch::NoGradGuard no_grad;
    params_.get("w").view(-1)[1].fill_(std::numeric_limits<float>::infinity());
  }
  absl::Status s = SaveCheckpoint(dir_, {30, 0}, params_, opt, CheckpointHealth::kGood).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("w is not finite"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step-00000030"));
}

TEST_F(CheckpointRollbackTest, ResumesFromTheNewestAtOrBeforeAndDeletesNewerOnes) {
  absl::StatusOr<std::optional<std::string>> kept = KeepCheckpointsAtOrBefore(dir_, 12);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ(fs::path(**kept).filename(), "step-00000010");
  EXPECT_EQ(Names(), (std::vector<std::string>{"step-00000005", "step-00000010"}));
  // A later plain restart cannot jump forward past the rollback any more.
  EXPECT_EQ(fs::path(*LatestCheckpoint(dir_)).filename(), "step-00000010");
}

TEST_F(CheckpointRollbackTest, AStepWithACheckpointKeepsThatCheckpoint) {
  absl::StatusOr<std::optional<std::string>> kept = KeepCheckpointsAtOrBefore(dir_, 15);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(fs::path(**kept).filename(), "step-00000015");
  EXPECT_EQ(Names().size(), 3u);
}

TEST_F(CheckpointRollbackTest, NothingAtOrBeforeMeansStartOverWithNoCheckpoints) {
  fs::create_directories(fs::path(dir_) / ".step-00000020.tmp");  // an interrupted save
  absl::StatusOr<std::optional<std::string>> kept = KeepCheckpointsAtOrBefore(dir_, 4);
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->has_value());
  EXPECT_TRUE(Names().empty());
}

TEST_F(CheckpointRollbackTest, ComparesStepsAsNumbersPastEightDigits) {
  fs::create_directories(fs::path(dir_) / "step-123456789");
  fs::create_directories(fs::path(dir_) / "step-1000000000");
  absl::StatusOr<std::optional<std::string>> kept = KeepCheckpointsAtOrBefore(dir_, 999999999);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(fs::path(**kept).filename(), "step-123456789");
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step-1000000000"));
  fs::create_directories(fs::path(dir_) / "step-1000000000");
  EXPECT_EQ(fs::path(*LatestCheckpoint(dir_)).filename(), "step-1000000000");
}

TEST(CheckpointRollbackNoFolderTest, AMissingFolderHasNothingToResume) {
  absl::StatusOr<std::optional<std::string>> kept =
      KeepCheckpointsAtOrBefore("/nonexistent/ballast/checkpoints", 10);
  ASSERT_TRUE(kept.ok());
  EXPECT_FALSE(kept->has_value());
}

}  // namespace
}  // namespace ballast::train
