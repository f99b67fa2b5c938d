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
  guard.Acted(v, health);
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

TEST(Guard, RollsBackByDefaultAfterTheSpecsBadStreak) {
  // GuardOptions' defaults are a job's (common/spec_rules.h).
  Guard guard;
  const auto streak = static_cast<int64_t>(SpecDefaultNumber("guard.max_consecutive_bad"));
  ASSERT_GT(streak, 1);
  for (int64_t step = 1; step < streak; ++step) {
    EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(step)).action, GuardAction::kSkip);
  }
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(streak)).action, GuardAction::kRollback);
  EXPECT_EQ(guard.rollbacks(), 1);
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
  guard.Acted({.action = GuardAction::kSkip, .trigger = GuardTrigger::kNonFinite}, Healthy(1));
  EXPECT_EQ(guard.consecutive_bad(), 1);
  EXPECT_EQ(guard.Judge(NonFiniteGradient(2)).action, GuardAction::kRollback);
}

StepHealth WithLoss(int64_t step, double loss, double grad_norm) {
  StepHealth h = Healthy(step);
  h.loss = loss;
  h.grad_norm = grad_norm;
  return h;
}

TEST(Guard, AStepWithoutSupervisionIsBadAndCountsTowardTheStreak) {
  Guard guard(GuardOptions{.max_consecutive_bad = 2, .max_rollbacks = 0});
  StepHealth empty = Healthy(1);
  empty.supervised_tokens = 0;
  GuardVerdict v = JudgeAndAct(guard, empty);
  EXPECT_EQ(v.action, GuardAction::kSkip);
  EXPECT_EQ(v.trigger, GuardTrigger::kNoSupervision);
  empty.step = 2;
  v = JudgeAndAct(guard, empty);
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_TRUE(v.budget_spent);  // a data set with no supervised token fails the job
  EXPECT_THAT(v.reason, HasSubstr("no supervised tokens; 2 bad steps in a row"));
}

TEST(Guard, ALossSpikeRollsBackOnceTheWindowIsFull) {
  Guard guard(GuardOptions{
      .max_consecutive_bad = 3, .max_rollbacks = 3, .spike_window = 10, .loss_spike_zscore = 6});
  // Warm-up: nine steps are not a window yet, so even a jump is no spike.
  for (int64_t step = 1; step <= 9; ++step) {
    EXPECT_EQ(JudgeAndAct(guard, WithLoss(step, 2.0 + 0.01 * (step % 3), 0.5)).action,
              GuardAction::kApply);
  }
  EXPECT_EQ(guard.Judge(WithLoss(10, 9.0, 0.5)).action, GuardAction::kApply);
  guard.Acted({.action = GuardAction::kApply}, WithLoss(10, 2.01, 0.5));
  // Noise of the window's own size passes; a jump of 6 robust deviations does not.
  EXPECT_EQ(guard.Judge(WithLoss(11, 2.03, 0.5)).action, GuardAction::kApply);
  GuardVerdict v = JudgeAndAct(guard, WithLoss(11, 2.5, 0.5));
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_EQ(v.trigger, GuardTrigger::kSpike);
  EXPECT_THAT(v.reason, HasSubstr("loss spike: 2.5 is "));
  EXPECT_THAT(v.reason, HasSubstr("above the median 2.01 of the last 10 healthy steps"));
  EXPECT_EQ(guard.rollbacks(), 1);
}

TEST(Guard, AFlatWindowTakesARiseOfOnePercentForASpike) {
  Guard guard(GuardOptions{.spike_window = 8, .loss_spike_zscore = 6});
  for (int64_t step = 1; step <= 8; ++step) JudgeAndAct(guard, WithLoss(step, 3.0, 1.0));
  EXPECT_EQ(guard.Judge(WithLoss(9, 3.02, 1.0)).action, GuardAction::kApply);
  EXPECT_EQ(guard.Judge(WithLoss(9, 3.04, 1.0)).trigger, GuardTrigger::kSpike);
}

TEST(Guard, GradNormSpikesAreJudgedOnlyWhenAsked) {
  for (double zscore : {0.0, 6.0}) {
    Guard guard(GuardOptions{.spike_window = 8, .grad_norm_spike_zscore = zscore});
    for (int64_t step = 1; step <= 8; ++step) {
      JudgeAndAct(guard, WithLoss(step, 2.0, 1.0 + 0.1 * (step % 2)));
    }
    const GuardVerdict v = guard.Judge(WithLoss(9, 2.0, 50.0));
    EXPECT_EQ(v.trigger, zscore > 0 ? GuardTrigger::kSpike : GuardTrigger::kNone) << zscore;
  }
}

TEST(Guard, ALossPinnedNearZeroIsACollapse) {
  Guard guard(GuardOptions{.max_rollbacks = 1, .collapse_window = 5, .collapse_loss = 1e-4});
  for (int64_t step = 1; step <= 4; ++step) {
    EXPECT_EQ(JudgeAndAct(guard, WithLoss(step, 0.0, 0.3 * step)).action, GuardAction::kApply);
  }
  GuardVerdict v = JudgeAndAct(guard, WithLoss(5, 0.0, 2.0));
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_EQ(v.trigger, GuardTrigger::kCollapse);
  EXPECT_THAT(v.reason, HasSubstr("the loss stayed below 0.0001 for 5 steps"));
  // After the rollback the run is counted afresh.
  EXPECT_EQ(JudgeAndAct(guard, WithLoss(6, 0.0, 1.0)).action, GuardAction::kApply);
}

TEST(Guard, AGradNormThatNoLongerChangesIsACollapse) {
  // DESIGN.md's SDAR run: every step's grad_norm 1.414, whatever the loss.
  Guard guard(GuardOptions{.collapse_window = 4});
  for (int64_t step = 1; step <= 3; ++step) {
    EXPECT_EQ(JudgeAndAct(guard, WithLoss(step, 1.0 + step, 1.41421)).action, GuardAction::kApply);
  }
  GuardVerdict v = guard.Judge(WithLoss(4, 5.0, 1.414211));
  EXPECT_EQ(v.trigger, GuardTrigger::kCollapse);
  EXPECT_THAT(v.reason, HasSubstr("grad_norm stayed at 1.41421 for 4 steps"));
  // A grad_norm that moves is healthy.
  EXPECT_EQ(guard.Judge(WithLoss(4, 5.0, 1.3)).trigger, GuardTrigger::kNone);
}

TEST(Guard, ARollbackSaysWhereTheTroubleBegan) {
  GuardOptions options;
  options.max_consecutive_bad = 3;
  Guard guard(options);
  EXPECT_EQ(JudgeAndAct(guard, Healthy(1)).action, GuardAction::kApply);
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(2)).action, GuardAction::kSkip);
  EXPECT_EQ(JudgeAndAct(guard, NonFiniteGradient(3)).action, GuardAction::kSkip);
  const GuardVerdict v = JudgeAndAct(guard, NonFiniteGradient(4));
  EXPECT_EQ(v.action, GuardAction::kRollback);
  EXPECT_EQ(v.episode_start, 2);

  GuardOptions collapse;
  collapse.collapse_window = 4;
  Guard collapsing(collapse);
  GuardVerdict last;
  for (int64_t step = 1; step <= 4; ++step) {
    StepHealth h = Healthy(step);
    h.loss = 0;
    h.grad_norm = 0.5 + static_cast<double>(step);
    last = JudgeAndAct(collapsing, h);
  }
  EXPECT_EQ(last.trigger, GuardTrigger::kCollapse);
  EXPECT_EQ(last.episode_start, 1);
}

TEST(Guard, CountsCleanStepsSinceTheLastBadOne) {
  Guard guard;
  JudgeAndAct(guard, Healthy(1));
  JudgeAndAct(guard, Healthy(2));
  EXPECT_EQ(guard.clean_steps(), 2);
  JudgeAndAct(guard, NonFiniteGradient(3));
  EXPECT_EQ(guard.clean_steps(), 0);
  JudgeAndAct(guard, Healthy(4));
  EXPECT_EQ(guard.clean_steps(), 1);
}

TEST(Guard, CutsTheLearningRateAfterARollbackAndReWarmsIt) {
  GuardOptions options;
  options.max_consecutive_bad = 1;
  options.lr_cut = 0.1;
  options.rewarm_steps = 3;
  Guard guard(options);
  EXPECT_DOUBLE_EQ(guard.LrScale(), 1);
  ASSERT_EQ(JudgeAndAct(guard, NonFiniteGradient(1)).action, GuardAction::kRollback);
  EXPECT_DOUBLE_EQ(guard.LrScale(), 0.1);
  JudgeAndAct(guard, Healthy(1));
  EXPECT_DOUBLE_EQ(guard.LrScale(), 0.4);
  JudgeAndAct(guard, Healthy(2));
  JudgeAndAct(guard, Healthy(3));
  EXPECT_DOUBLE_EQ(guard.LrScale(), 1);

  options.rewarm_steps = 0;  // the cut stays
  Guard kept(options);
  JudgeAndAct(kept, NonFiniteGradient(1));
  for (int64_t step = 1; step <= 5; ++step) JudgeAndAct(kept, Healthy(step));
  EXPECT_DOUBLE_EQ(kept.LrScale(), 0.1);
}

StepHealth Unsupervised(int64_t step) {
  StepHealth h = Healthy(step);
  h.supervised_tokens = 0;
  return h;
}

TEST(Guard, ARunThatAppliedNoStepFailsNamingWhy) {
  // Shorter than max_consecutive_bad: the streak rule never fires.
  Guard guard;
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_EQ(JudgeAndAct(guard, Unsupervised(step)).action, GuardAction::kSkip);
  }
  EXPECT_EQ(guard.TooFewApplied(/*applied=*/0, /*steps=*/2),
            "no step was applied: every step had no supervised tokens");
  EXPECT_EQ(guard.MostSkippedBy(), GuardTrigger::kNoSupervision);

  Guard non_finite;
  JudgeAndAct(non_finite, NonFiniteGradient(1));
  EXPECT_EQ(non_finite.TooFewApplied(0, 1),
            "no step was applied: every step had a non-finite loss or grad_norm");
}

TEST(Guard, ARunWithSkipsOfSeveralCausesCountsEach) {
  Guard guard(GuardOptions{.max_consecutive_bad = 0});
  JudgeAndAct(guard, Unsupervised(1));
  JudgeAndAct(guard, NonFiniteGradient(2));
  JudgeAndAct(guard, Unsupervised(3));
  EXPECT_EQ(guard.TooFewApplied(0, 3),
            "no step was applied; of the steps this run skipped, 1 had a non-finite loss or "
            "grad_norm, 2 had no supervised tokens");
  EXPECT_EQ(guard.MostSkippedBy(), GuardTrigger::kNoSupervision);
}

TEST(Guard, ARunBelowTheMinimumAppliedFractionFails) {
  Guard guard(GuardOptions{.max_consecutive_bad = 0, .min_applied_fraction = 0.5});
  for (int64_t step = 1; step <= 10; ++step) {
    JudgeAndAct(guard, step <= 4 ? Healthy(step) : NonFiniteGradient(step));
  }
  EXPECT_EQ(guard.TooFewApplied(4, 10),
            "only 4 of 10 steps were applied, fewer than guard.min_applied_fraction (0.5) of "
            "them: every skipped step had a non-finite loss or grad_norm");
  // Half is enough.
  EXPECT_EQ(guard.TooFewApplied(5, 10), "");
}

TEST(Guard, AMinimumAppliedFractionOfZeroStillFailsARunWithNoAppliedStep) {
  Guard guard(GuardOptions{.min_applied_fraction = 0});
  EXPECT_EQ(guard.TooFewApplied(1, 1000), "");
  EXPECT_THAT(guard.TooFewApplied(0, 1000), HasSubstr("no step was applied"));
}

TEST(Guard, AResumedRunNamesOnlyTheSkipsItSaw) {
  // Applied steps count over the job; this guard saw 2 of its 8 skips.
  Guard guard;
  JudgeAndAct(guard, Unsupervised(9));
  JudgeAndAct(guard, Unsupervised(10));
  EXPECT_EQ(guard.TooFewApplied(2, 10),
            "only 2 of 10 steps were applied, fewer than guard.min_applied_fraction (0.5) of "
            "them; of the steps this run skipped, 2 had no supervised tokens");
  EXPECT_EQ(Guard().TooFewApplied(0, 10), "no step was applied");
}

}  // namespace
}  // namespace ballast::train
