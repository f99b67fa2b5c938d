// The early-stopping rule: warmup, the first best, min_delta (strict: a tie
// never improves), patience, metrics where higher is better, and a NaN.
#include "worker/train/trainer/early_stopping.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ballast::train {
namespace {

// Runs `values` (the evaluations at steps 1, 2, ...) through the rule as the
// trainer does, every improvement's checkpoint kept, and returns the
// progress and the step it stopped at (0: never).
struct Outcome {
  EvalProgress progress;
  int64_t stopped_at = 0;
  std::vector<bool> best;
};

Outcome Judge(const EarlyStoppingRule& rule, const std::vector<double>& values) {
  const EarlyStopping es(rule);
  Outcome out;
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t step = static_cast<int64_t>(i) + 1;
    const bool best = es.Improves(out.progress, values[i]);
    out.best.push_back(best);
    out.progress = es.Record(out.progress, step, values[i], best);
    if (es.ShouldStop(out.progress)) {
      out.stopped_at = step;
      break;
    }
  }
  return out;
}

TEST(EarlyStopping, StopsAfterPatienceEvaluationsWithoutImprovement) {
  const Outcome out = Judge({.patience = 2}, {3.0, 2.0, 2.5, 1.9, 2.1, 2.2, 0.1});
  EXPECT_EQ(out.best, (std::vector<bool>{true, true, false, true, false, false}));
  EXPECT_EQ(out.stopped_at, 6);
  EXPECT_EQ(out.progress.best_step, 4);
  EXPECT_EQ(out.progress.best_value, 1.9);
  EXPECT_EQ(out.progress.since_best, 2);
  EXPECT_EQ(out.progress.evaluations, 6);
  const EarlyStopping es({.patience = 2});
  EXPECT_EQ(es.StopReason(out.progress, 6),
            "stopped early at step 6: eval_loss did not improve by 0 for 2 evaluations since "
            "step 4");
  EXPECT_EQ(es.BestReason(out.progress), "the best eval_loss, 1.9 at step 4");
}

TEST(EarlyStopping, ATieIsNoImprovement) {
  const Outcome out = Judge({.patience = 1}, {2.0, 2.0});
  EXPECT_EQ(out.best, (std::vector<bool>{true, false}));
  EXPECT_EQ(out.stopped_at, 2);
  EXPECT_EQ(out.progress.best_step, 1);
}

TEST(EarlyStopping, AnImprovementMustBeatTheBestByMoreThanMinDelta) {
  // Gains of 0.05 and 0.01 do not count, 0.15 do (each well away from 0.1,
  // whatever the binary rounding of the values).
  const Outcome out = Judge({.patience = 3, .min_delta = 0.1}, {2.0, 1.95, 1.85, 1.84, 1.7});
  EXPECT_EQ(out.best, (std::vector<bool>{true, false, true, false, true}));
  EXPECT_EQ(out.stopped_at, 0);
  EXPECT_EQ(out.progress.best_step, 5);
  // The gains 2.0 -> 1.95 and 1.85 -> 1.84 did not reset patience: a run
  // creeping down by less than min_delta stops.
  const Outcome creeping = Judge({.patience = 3, .min_delta = 0.1}, {2.0, 1.95, 1.93, 1.92});
  EXPECT_EQ(creeping.stopped_at, 4);
  EXPECT_EQ(EarlyStopping({.patience = 3, .min_delta = 0.1}).StopReason(creeping.progress, 4),
            "stopped early at step 4: eval_loss did not improve by 0.1 for 3 evaluations since "
            "step 1");
}

TEST(EarlyStopping, WarmupEvaluationsNeitherCountNorCanBeTheBest) {
  const Outcome out = Judge({.patience = 1, .warmup_evals = 2}, {0.5, 9.0, 3.0, 4.0});
  EXPECT_EQ(out.best, (std::vector<bool>{false, false, true, false}));
  EXPECT_EQ(out.progress.best_step, 3);
  EXPECT_EQ(out.stopped_at, 4);
}

TEST(EarlyStopping, HigherIsBetterForARankingMetric) {
  const EarlyStoppingRule rule{.metric = "mrr_at_10", .patience = 2, .min_delta = 0.01};
  EXPECT_TRUE(EarlyStopping(rule).higher_is_better());
  const Outcome out = Judge(rule, {0.5, 0.6, 0.605, 0.4, 0.7});
  EXPECT_EQ(out.best, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(out.stopped_at, 4);
  EXPECT_EQ(out.progress.best_step, 2);
  v1::EvalReport ranked;
  ranked.set_groups(3);
  ranked.set_mrr_at_10(0.25);
  ranked.set_ndcg_at_10(0.5);
  EXPECT_EQ(EarlyStopping(rule).MetricOf(ranked), 0.25);
  EXPECT_EQ(EarlyStopping({.metric = "ndcg_at_10"}).MetricOf(ranked), 0.5);
  EXPECT_EQ(EarlyStopping({}).MetricOf(ranked), std::nullopt);  // no loss
  ranked.set_groups(0);
  EXPECT_EQ(EarlyStopping(rule).MetricOf(ranked), std::nullopt);
}

TEST(EarlyStopping, ANaNIsNeverTheBestAndCountsAgainstPatience) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Outcome out = Judge({.patience = 2}, {nan, 2.0, nan, nan});
  EXPECT_EQ(out.best, (std::vector<bool>{false, true, false, false}));
  EXPECT_EQ(out.stopped_at, 4);
  EXPECT_EQ(out.progress.best_step, 2);
}

// A checkpoint the health gate refused leaves its evaluation out of the
// best: the trainer records it as no improvement.
TEST(EarlyStopping, AnEvaluationWhoseCheckpointWasRefusedIsNotTheBest) {
  const EarlyStopping es({.patience = 3});
  EvalProgress p = es.Record({}, 1, 2.0, true);
  ASSERT_TRUE(es.Improves(p, 1.0));
  p = es.Record(p, 2, 1.0, /*best=*/false);
  EXPECT_EQ(p.best_step, 1);
  EXPECT_EQ(p.since_best, 1);
  EXPECT_TRUE(es.Improves(p, 1.5));  // still measured against the kept best
}

TEST(EarlyStopping, PatienceZeroNeverStops) {
  const Outcome out = Judge({}, {1.0, 2.0, 3.0, 4.0, 5.0});
  EXPECT_EQ(out.stopped_at, 0);
  EXPECT_EQ(out.progress.best_step, 1);
  EXPECT_EQ(out.progress.since_best, 4);
}

TEST(EarlyStopping, TheRuleComesFromEarlyStoppingOrExportBest) {
  v1::JobSpec spec;
  EXPECT_FALSE(EarlyStoppingRule::FromSpec(spec).has_value());
  spec.set_export_("last");
  EXPECT_FALSE(EarlyStoppingRule::FromSpec(spec).has_value());
  spec.set_export_("best");
  std::optional<EarlyStoppingRule> best = EarlyStoppingRule::FromSpec(spec);
  ASSERT_TRUE(best.has_value());
  EXPECT_EQ(best->metric, "eval_loss");
  EXPECT_EQ(best->patience, 0);
  spec.clear_export_();
  spec.mutable_early_stopping()->set_patience(4);
  spec.mutable_early_stopping()->set_min_delta(0.5);
  spec.mutable_early_stopping()->set_warmup_evals(2);
  spec.mutable_early_stopping()->set_metric("ndcg_at_10");
  std::optional<EarlyStoppingRule> rule = EarlyStoppingRule::FromSpec(spec);
  ASSERT_TRUE(rule.has_value());
  EXPECT_EQ(rule->metric, "ndcg_at_10");
  EXPECT_EQ(rule->patience, 4);
  EXPECT_EQ(rule->min_delta, 0.5);
  EXPECT_EQ(rule->warmup_evals, 2);
}

}  // namespace
}  // namespace ballast::train
