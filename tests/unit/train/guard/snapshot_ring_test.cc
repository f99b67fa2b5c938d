#include "worker/train/guard/snapshot_ring.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "worker/train/model/rng_state.h"

namespace ballast::train {
namespace {

class SnapshotRingTest : public ::testing::Test {
 protected:
  SnapshotRingTest() {
    params_.Add("a", torch::randn({3, 4}), ParamStore::kNoLayer, /*trainable=*/true);
    params_.Add("b", torch::randn({5}), ParamStore::kNoLayer, /*trainable=*/true);
    params_.Add("frozen", torch::randn({2}), ParamStore::kNoLayer, /*trainable=*/false);
  }

  // One AdamW update from random gradients: the weights and moments move.
  void Update() {
    for (const std::string& n : params_.TrainableNames()) {
      params_.get(n).mutable_grad() = torch::randn_like(params_.get(n));
    }
    optimizer_.Step(params_, 0.1);
  }

  ParamStore params_;
  AdamW optimizer_{AdamWConfig{}, params_};
};

TEST_F(SnapshotRingTest, RestoreGivesBackTheWeightsTheMomentsAndTheGenerator) {
  Update();
  SnapshotRing ring(2);
  ring.Take({1, 4}, params_, optimizer_, c10::kCPU);
  ring.MarkGood(1, 0, 0);
  const at::Tensor a = params_.get("a").clone();
  const auto moments = optimizer_.StateDict();
  const at::Tensor draw = torch::rand({8});  // what the generator gives next

  Update();
  Update();
  torch::rand({100});
  const at::Tensor a_storage = params_.get("a");
  const TrainSnapshot* s = ring.NewestGoodBefore(5);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->position.step, 1);
  EXPECT_EQ(s->position.data_cursor, 4);
  ASSERT_TRUE(SnapshotRing::Restore(*s, &params_, &optimizer_, c10::kCPU).ok());

  EXPECT_TRUE(torch::equal(params_.get("a"), a));
  EXPECT_TRUE(params_.get("a").is_same(a_storage));  // in place
  EXPECT_EQ(optimizer_.steps(), 1);
  for (const auto& [name, t] : optimizer_.StateDict()) {
    EXPECT_TRUE(torch::equal(t, moments.at(name))) << name;
  }
  EXPECT_TRUE(torch::equal(torch::rand({8}), draw));
}

TEST_F(SnapshotRingTest, ASnapshotIsGoodOnlyAfterEnoughCleanStepsFollowIt) {
  SnapshotRing ring(4);
  ring.Take({2, 0}, params_, optimizer_, c10::kCPU);
  ring.MarkGood(3, /*clean_steps=*/3, /*good_after=*/2);
  EXPECT_EQ(ring.NewestGoodBefore(10), nullptr);  // one step after it
  ring.MarkGood(4, 4, 2);
  ASSERT_NE(ring.NewestGoodBefore(10), nullptr);

  ring.Take({6, 0}, params_, optimizer_, c10::kCPU);
  // A bad step came at 7: the clean run at step 8 is 1 step long.
  ring.MarkGood(8, 1, 2);
  EXPECT_EQ(ring.NewestGoodBefore(10)->position.step, 2);
  // Only states from before the trouble count.
  EXPECT_EQ(ring.NewestGoodBefore(2), nullptr);
}

TEST_F(SnapshotRingTest, KeepsTheNewestAndDropsWhatARollbackAbandons) {
  SnapshotRing ring(2);
  for (int64_t step : {2, 4, 6}) ring.Take({step, 0}, params_, optimizer_, c10::kCPU);
  EXPECT_EQ(ring.size(), 2);
  ring.MarkGood(100, 100, 0);
  EXPECT_EQ(ring.NewestGoodBefore(100)->position.step, 6);
  ring.DropAfter(4);
  EXPECT_EQ(ring.size(), 1);
  EXPECT_EQ(ring.NewestGoodBefore(100)->position.step, 4);
}

TEST_F(SnapshotRingTest, NamesTheBestEvaluationsItsSnapshotsWouldPutBack) {
  SnapshotRing ring(3);
  ring.Take({2, 0}, params_, optimizer_, c10::kCPU);  // before any evaluation
  ring.Take({4, 0, {.evaluations = 1, .best_step = 4}}, params_, optimizer_, c10::kCPU);
  ring.Take({6, 0, {.evaluations = 2, .best_step = 4}}, params_, optimizer_, c10::kCPU);
  ring.Take({8, 0, {.evaluations = 3, .best_step = 8}}, params_, optimizer_, c10::kCPU);
  // The oldest (step 2) left the ring; each snapshot names its own best.
  EXPECT_EQ(ring.BestEvaluationSteps(), (std::vector<int64_t>{4, 4, 8}));
  ring.DropAfter(6);
  EXPECT_EQ(ring.BestEvaluationSteps(), (std::vector<int64_t>{4, 4}));
}

}  // namespace
}  // namespace ballast::train
