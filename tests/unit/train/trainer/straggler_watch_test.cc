#include "worker/train/trainer/straggler_watch.h"

#include <gtest/gtest.h>

#include <random>

namespace ballast::train {
namespace {

// Own step times of `ranks` ranks around 0.1 s (a few percent of noise),
// with `slow` (if any) `factor` times slower.
std::vector<double> Times(std::mt19937* rng, int ranks, int slow, double factor) {
  std::uniform_real_distribution<double> noise(0.97, 1.03);
  std::vector<double> out;
  for (int r = 0; r < ranks; ++r) out.push_back(0.1 * noise(*rng) * (r == slow ? factor : 1));
  return out;
}

TEST(StragglerWatch, ARankSlowForTheWindowIsReportedOnceAndAgainWhenItKeepsUp) {
  std::mt19937 rng(std::random_device{}());
  StragglerWatch watch(/*factor=*/2, /*window=*/4);
  int64_t step = 0;
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, -1, 1)).empty());
  // Three slow steps are not a window; the fourth is.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, 2, 3)).empty());
  std::vector<v1::StragglerReport> reports = watch.Observe(++step, Times(&rng, 4, 2, 3));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rank(), 2);
  EXPECT_EQ(reports[0].step(), 14);
  EXPECT_TRUE(reports[0].straggling());
  EXPECT_NEAR(reports[0].step_time_s(), 0.3, 0.3 * 0.05);
  EXPECT_NEAR(reports[0].others_step_time_s(), 0.1, 0.1 * 0.05);
  // Still slow: nothing new. A fast step breaks the run of fast steps to come.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, 2, 3)).empty());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, -1, 1)).empty());
  EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, 2, 3)).empty());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(watch.Observe(++step, Times(&rng, 4, -1, 1)).empty());
  reports = watch.Observe(++step, Times(&rng, 4, -1, 1));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rank(), 2);
  EXPECT_FALSE(reports[0].straggling());
}

TEST(StragglerWatch, ARankJustUnderTheFactorIsNoStraggler) {
  StragglerWatch watch(/*factor=*/2, /*window=*/2);
  for (int64_t step = 1; step <= 20; ++step) {
    EXPECT_TRUE(watch.Observe(step, {0.1, 0.1, 0.199}).empty());
  }
  // Two ranks: each one's other is the other one, and only the slow one is slow.
  StragglerWatch two(/*factor=*/1.5, /*window=*/1);
  std::vector<v1::StragglerReport> reports = two.Observe(1, {0.1, 0.5});
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].rank(), 1);
  EXPECT_DOUBLE_EQ(reports[0].others_step_time_s(), 0.1);
}

TEST(StragglerWatch, OneRankHasNobodyToBeSlowerThan) {
  StragglerWatch watch(/*factor=*/2, /*window=*/1);
  EXPECT_TRUE(watch.Observe(1, {5.0}).empty());
}

}  // namespace
}  // namespace ballast::train
