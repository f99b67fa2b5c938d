#include "client/progress.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace ballast::client {
namespace {

TEST(Progress, FormatsDurationsWithTwoUnitsAtMost) {
  EXPECT_EQ(FormatDuration(0), "0s");
  EXPECT_EQ(FormatDuration(45.4), "45s");
  EXPECT_EQ(FormatDuration(59.6), "1m00s");
  EXPECT_EQ(FormatDuration(92), "1m32s");
  EXPECT_EQ(FormatDuration(3600 * 2 + 5 * 60 + 59), "2h05m");
  EXPECT_EQ(FormatDuration(86400 * 3 + 3600 * 4 + 1), "3d04h");
}

TEST(Progress, UnknownDurationIsADash) {
  EXPECT_EQ(FormatDuration(-1), "-");
  EXPECT_EQ(FormatDuration(NAN), "-");
  EXPECT_EQ(FormatDuration(INFINITY), "-");
}

TEST(Progress, EtaIsStepsLeftTimesStepTime) {
  EXPECT_EQ(FormatEta(12, 200, 0.5), "1m34s");
  EXPECT_EQ(FormatEta(200, 200, 0.5), "0s");
  // A step past max_steps (a resumed job reporting late) never gives a negative time.
  EXPECT_EQ(FormatEta(205, 200, 0.5), "0s");
  EXPECT_EQ(FormatEta(12, 200, 0), "-");
  EXPECT_EQ(FormatEta(12, 200, NAN), "-");
}

TEST(Progress, GroupsThousands) {
  EXPECT_EQ(FormatThousands(0), "0");
  EXPECT_EQ(FormatThousands(999), "999");
  EXPECT_EQ(FormatThousands(1949.6), "1,950");
  EXPECT_EQ(FormatThousands(1234567), "1,234,567");
  EXPECT_EQ(FormatThousands(-1234), "-1,234");
}

TEST(Progress, SparklineScalesMinToMaxOntoEightBars) {
  const std::vector<double> values = {0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(Sparkline(values), "▁▂▃▄▅▆▇█");
  const std::vector<double> shifted = {10, 17, 13.5};
  EXPECT_EQ(Sparkline(shifted), "▁█▅");
}

TEST(Progress, SparklineOfEqualValuesIsFlatAndNonFiniteIsMarked) {
  const std::vector<double> flat = {0.8, 0.8, 0.8};
  EXPECT_EQ(Sparkline(flat), "▄▄▄");
  // The spike's inf must not squash the finite values into one bar.
  const std::vector<double> spike = {1, INFINITY, 2, NAN};
  EXPECT_EQ(Sparkline(spike), "▁!█!");
  EXPECT_EQ(Sparkline(std::vector<double>{}), "");
}

v1::StepMetrics Step12() {
  v1::StepMetrics m;
  m.set_step(12);
  m.set_max_steps(200);
  m.set_loss(2.34119);
  m.set_grad_norm(0.812);
  m.set_lr(1e-4);
  m.set_tokens(4096);
  m.set_supervised_tokens(3000);
  m.set_tokens_per_s(1950.2);
  m.set_step_time_s(0.49);
  return m;
}

TEST(Progress, FitColumnsCountsCodePointsNotBytes) {
  EXPECT_EQ(FitColumns("step 1 ▁▂▃", 8), "step 1 ▁");
  EXPECT_EQ(FitColumns("step 1 ▁▂▃", 10), "step 1 ▁▂▃");
  EXPECT_EQ(FitColumns("step 1 ▁▂▃", 0), "step 1 ▁▂▃");
  EXPECT_EQ(FitColumns("abc", 2), "ab");
}

TEST(Progress, ProgressLineHasEveryFieldInOrder) {
  EXPECT_EQ(ProgressLine(Step12(), 0.49, "▁▂▃"),
            "step 12/200 loss 2.3412 grad_norm 0.812 lr 1.0e-04 tok/s 1,950 ETA 1m32s ▁▂▃");
  EXPECT_EQ(ProgressLine(Step12(), 0.49, ""),
            "step 12/200 loss 2.3412 grad_norm 0.812 lr 1.0e-04 tok/s 1,950 ETA 1m32s");
}

TEST(Progress, ProgressLineMarksSkippedAndUnsupervisedSteps) {
  v1::StepMetrics m = Step12();
  m.set_supervised_tokens(0);
  m.clear_loss();
  m.set_grad_norm(INFINITY);
  m.set_skipped(true);
  EXPECT_EQ(ProgressLine(m, 0.49, ""),
            "step 12/200 loss - grad_norm inf lr 1.0e-04 tok/s 1,950 ETA 1m32s skipped");
  // A non-finite loss is a loss, and the reason the step was skipped.
  m.set_supervised_tokens(3000);
  m.set_loss(NAN);
  EXPECT_EQ(ProgressLine(m, 0.49, ""),
            "step 12/200 loss nan grad_norm inf lr 1.0e-04 tok/s 1,950 ETA 1m32s skipped");
}

}  // namespace
}  // namespace ballast::client
