#include "worker/train/guard/guard.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ballast::train {
namespace {

using ::testing::HasSubstr;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

StepHealth Healthy(int64_t step) {
  StepHealth h;
  h.step = step;
  h.loss = 2.5;
  h.grad_norm = 0.8;
  return h;
}

StepHealth NonFiniteGradient(int64_t step) {
  StepHealth h = Healthy(step);
  h.grad_norm = kNaN;
  h.first_nonfinite = "model.layers.1.self_attn.q_proj.lora_B.weight";
  return h;
}

// Judges one step and acts on the verdict, as the trainer does at one rank.
GuardVerdict JudgeAndAct(Guard& guard, const StepHealth& health) {
  GuardVerdict v = guard.Judge(health);
  guard.Acted(v.action);
  return v;
}

TEST(Guard, AppliesAFiniteStep) {
  Guard guard;
  GuardVerdict v = JudgeAndAct(guard, Healthy(1));
  EXPECT_EQ(v.action, GuardAction::kApply);
  EXPECT_EQ(v.reason, "");
  EXPECT_EQ(guard.consecutive_bad(), 0);
}

TEST(Guard, SkipsANonFiniteGradientNamingTheTensor) {
  Guard guard;
  GuardVerdict v = JudgeAndAct(guard, NonFiniteGradient(3));
  EXPECT_EQ(v.action, GuardAction::kSkip);
  EXPECT_THAT(v.reason, HasSubstr("non-finite gradient in model.layers.1.self_attn.q_proj"));
  EXPECT_EQ(guard.consecutive_bad(), 1);
}

TEST(Guard, SkipsANonFiniteLossOrGradNorm) {
  for (double bad : {kNaN, kInf, -kInf}) {
    Guard guard;
    StepHealth loss = Healthy(1);
    loss.loss = bad;
    GuardVerdict v = guard.Judge(loss);
    EXPECT_EQ(v.action, GuardAction::kSkip) << bad;
    EXPECT_THAT(v.reason, HasSubstr("non-finite loss")) << bad;

    StepHealth norm = Healthy(1);
    norm.grad_norm = bad;  // finite here, non-finite after the reduction over ranks
    v = guard.Judge(norm);
    EXPECT_EQ(v.action, GuardAction::kSkip) << bad;
    EXPECT_THAT(v.reason, HasSubstr("non-finite grad_norm")) << bad;
  }
}

TEST(Guard, NeverRollsBackByDefault) {
  Guard guard;
  for (int64_t step = 1; step <= 50; ++step) {
    EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(step)).action, GuardAction::kSkip);
  }
  EXPECT_EQ(guard.consecutive_bad(), 50);
  EXPECT_EQ(guard.rollbacks(), 0);
}

TEST(Guard, RollsBackAfterThreeNonFiniteStepsInARow) {
  Guard guard(GuardOptions{.max_consecutive_bad = 3, .max_rollbacks = 2});
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(1)).action, GuardAction::kSkip);
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(2)).action, GuardAction::kSkip);
  GuardVerdict v = JudgeAndAct(guard, NonFiniteGradient(3));
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_FALSE(v.budget_spent);
  EXPECT_THAT(v.reason, HasSubstr("3 bad steps in a row"));
  EXPECT_EQ(guard.consecutive_bad(), 0);
  EXPECT_EQ(guard.rollbacks(), 1);
}

TEST(Guard, AHealthyStepEndsTheStreak) {
  Guard guard(GuardOptions{.max_consecutive_bad = 2, .max_rollbacks = 1});
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(1)).action, GuardAction::kSkip);
  EXPECT_EQ(JudgeAndAct(guard, Healthy(2)).action, GuardAction::kApply);
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(3)).action, GuardAction::kSkip);
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(4)).action, GuardAction::kRollback);
}

TEST(Guard, SaysWhenTheRollbackBudgetIsSpent) {
  Guard guard(GuardOptions{.max_consecutive_bad = 1, .max_rollbacks = 2});
  GuardVerdict first = JudgeAndAct(guard, NonFiniteGradient(1));
  GuardVerdict second = JudgeAndAct(guard, NonFiniteGradient(2));
  GuardVerdict third = JudgeAndAct(guard, NonFiniteGradient(3));
  EXPECT_EQ(first.action, GuardAction::kRollback);
  EXPECT_FALSE(first.budget_spent);
  EXPECT_FALSE(second.budget_spent);
  EXPECT_EQ(third.action, GuardAction::kRollback);
  EXPECT_TRUE(third.budget_spent);
  EXPECT_THAT(third.reason, HasSubstr("rollback budget (2) is spent"));
}

TEST(Guard, ActsOnTheAgreedVerdictOfAllRanks) {
  // This rank's step was healthy, another rank's was not: the agreed skip
  // counts toward the streak here too, so every rank rolls back together.
  Guard guard(GuardOptions{.max_consecutive_bad = 2, .max_rollbacks = 3});
  EXPECT_EQ(guard.Judge(Healthy(1)).action, GuardAction::kApply);
  guard.Acted(GuardAction::kSkip);
  EXPECT_EQ(guard.consecutive_bad(), 1);
  EXPECT_EQ(guard.Judge(NonFiniteGradient(2)).action, GuardAction::kRollback);
}

}  // namespace
}  // namespace ballast::train
