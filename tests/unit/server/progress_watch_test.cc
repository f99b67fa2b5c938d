#include "server/progress_watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ballast::server {
namespace {

using ::testing::HasSubstr;

v1::TrainingEvent Step(int64_t step, double seconds) {
  v1::TrainingEvent e;
  e.mutable_step_metrics()->set_step(step);
  e.mutable_step_metrics()->set_step_time_s(seconds);
  return e;
}

v1::TrainingEvent Phase(const std::string& phase, int32_t layer, const std::string& collective,
                        int64_t seq, int64_t since_ms) {
  v1::TrainingEvent e;
  v1::RankPhase* p = e.mutable_phase();
  p->set_step(4);
  p->set_phase(phase);
  p->set_layer(layer);
  p->set_collective(collective);
  p->set_collective_seq(seq);
  p->set_since_ms(since_ms);
  return e;
}

v1::WatchdogSpec Spec(double factor, double floor_s) {
  v1::WatchdogSpec spec;
  spec.set_stall_factor(factor);
  spec.set_stall_floor_s(floor_s);
  return spec;
}

TEST(ProgressWatch, NothingIsJudgedBeforeTheAttemptsFirstStep) {
  ProgressWatch watch;
  watch.Observe(1, 0, Phase("data", -1, "", 0, 0), 1000);
  EXPECT_FALSE(watch.Stalled(1, Spec(2, 1), 2, 1000000000).has_value());
}

TEST(ProgressWatch, TheBoundIsTheFactorTimesTheMedianStepOrTheFloor) {
  ProgressWatch watch;
  // Median 3 s (a slow first step and a checkpoint step do not move it).
  int64_t now = 1'000'000;
  for (int step = 1; step <= 5; ++step) {
    const double seconds = step == 1 ? 60 : (step == 4 ? 20 : 3);
    now += static_cast<int64_t>(seconds * 1000);
    watch.Observe(1, 0, Step(step, seconds), now);
    watch.Observe(1, 1, Step(step, seconds), now);
  }
  // 4 x 3 s = 12 s is above the 5 s floor.
  EXPECT_FALSE(watch.Stalled(1, Spec(4, 5), 2, now + 12000).has_value());
  std::optional<v1::StallReport> stall = watch.Stalled(1, Spec(4, 5), 2, now + 12001);
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->step(), 6);
  EXPECT_DOUBLE_EQ(stall->bound_s(), 12);
  EXPECT_DOUBLE_EQ(stall->waited_s(), 12.001);
  // The floor when it is the larger.
  EXPECT_FALSE(watch.Stalled(1, Spec(4, 30), 2, now + 29000).has_value());
  EXPECT_TRUE(watch.Stalled(1, Spec(4, 30), 2, now + 30001).has_value());
  // A stored spec without the watchdog gets its defaults: 10 x 3 s < 120 s.
  EXPECT_FALSE(watch.Stalled(1, v1::WatchdogSpec(), 2, now + 119000).has_value());
  EXPECT_TRUE(watch.Stalled(1, v1::WatchdogSpec(), 2, now + 120001).has_value());
}

TEST(ProgressWatch, AStallSaysWhereEveryRankWas) {
  ProgressWatch watch;
  watch.Observe(3, 0, Step(4, 1), 10'000);
  watch.Observe(3, 1, Step(4, 1), 10'000);
  watch.Observe(3, 0, Phase("data", -1, "", 0, 10'100), 10'700);
  watch.Observe(3, 1, Phase("collective", 17, "all_gather", 4182, 10'200), 10'800);
  std::optional<v1::StallReport> stall = watch.Stalled(3, Spec(2, 5), 3, 16'000);
  ASSERT_TRUE(stall.has_value());
  ASSERT_EQ(stall->ranks_size(), 3);
  EXPECT_EQ(stall->ranks(0).phase(), "data");
  EXPECT_EQ(stall->ranks(1).collective_seq(), 4182);
  EXPECT_EQ(stall->ranks(2).rank(), 2);
  EXPECT_EQ(stall->ranks(2).phase(), "");
  EXPECT_EQ(ProgressWatch::Describe(*stall, 16'000),
            "no rank completed step 5 in 6.0 s (bound 5.0 s): rank 0 reading data (step 4) for "
            "5.9 s; rank 1 in all_gather #4182 of layer 17 (step 4) for 5.8 s; rank 2 held no "
            "phase long enough to report one");
}

TEST(ProgressWatch, ANewAttemptStartsAfresh) {
  ProgressWatch watch;
  watch.Observe(1, 0, Step(4, 1), 10'000);
  watch.Observe(1, 0, Phase("data", -1, "", 0, 10'100), 10'700);
  ASSERT_TRUE(watch.Stalled(1, Spec(2, 5), 1, 20'000).has_value());
  // The restart, before it reports anything, and while it loads its model:
  // not judged until its first step.
  EXPECT_FALSE(watch.Stalled(2, Spec(2, 5), 1, 20'000).has_value());
  watch.Observe(2, 0, Phase("forward", 2, "", 0, 21'000), 21'600);
  EXPECT_FALSE(watch.Stalled(2, Spec(2, 5), 1, 60'000).has_value());
  watch.Observe(2, 0, Step(3, 1), 61'000);
  std::optional<v1::StallReport> stall = watch.Stalled(2, Spec(2, 5), 1, 66'001);
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->step(), 4);
  EXPECT_THAT(ProgressWatch::Describe(*stall, 66'001), HasSubstr("in the forward of layer 2"));
}

}  // namespace
}  // namespace ballast::server
