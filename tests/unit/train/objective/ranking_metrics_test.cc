#include "worker/train/objective/ranking_metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ballast::train {
namespace {

TEST(RankingMetricsTest, MrrAndNdcgAtTenAsMtebDefinesThem) {
  RankingEvaluator e;
  e.AddGroup({0.9, 0.1, 0.5}, {1, 0, 0});  // the positive first: 1 and 1
  e.AddGroup({0.2, 0.9, 0.5}, {1, 0, 0});  // third: 1/3 and 1/log2(4) = 0.5
  e.AddGroup({0.3, 0.1}, {0, 0});          // no positive: not counted
  const RankingMetrics m = e.Metrics();
  EXPECT_EQ(m.groups, 2);
  EXPECT_DOUBLE_EQ(m.mrr_at_10, (1.0 + 1.0 / 3) / 2);
  EXPECT_DOUBLE_EQ(m.ndcg_at_10, (1.0 + 0.5) / 2);
}

TEST(RankingMetricsTest, TiesRankThePositiveLastAndRanksPastTenCountNothing) {
  RankingEvaluator ties;
  ties.AddGroup({1, 1, 1}, {1, 0, 0});
  EXPECT_DOUBLE_EQ(ties.Metrics().mrr_at_10, 1.0 / 3);

  std::vector<double> scores(12);
  std::vector<float> relevance(12, 0);
  for (int i = 0; i < 12; ++i) scores[i] = 12 - i;
  relevance[11] = 1;  // ranked 12th
  RankingEvaluator far;
  far.AddGroup(scores, relevance);
  EXPECT_EQ(far.Metrics().mrr_at_10, 0);
  EXPECT_EQ(far.Metrics().ndcg_at_10, 0);

  // Two positives at ranks 1 and 3: DCG 1 + 0.5 over the ideal 1 + 1/log2(3).
  RankingEvaluator two;
  two.AddGroup({3, 2, 1}, {1, 0, 1});
  EXPECT_DOUBLE_EQ(two.Metrics().ndcg_at_10, 1.5 / (1 + 1 / std::log2(3.0)));
  EXPECT_DOUBLE_EQ(two.Metrics().mrr_at_10, 1.0);
}

}  // namespace
}  // namespace ballast::train
