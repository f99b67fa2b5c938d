#include "worker/train/objective/ranking_metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ballast::train {

void RankingEvaluator::AddGroup(const std::vector<double>& scores,
                                const std::vector<float>& relevance) {
  const int64_t positives =
      std::count_if(relevance.begin(), relevance.end(), [](float r) { return r > 0; });
  if (positives == 0) return;
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (scores[a] != scores[b]) return scores[a] > scores[b];
    return relevance[a] < relevance[b];  // ties: negatives first
  });
  double reciprocal_rank = 0, dcg = 0, ideal = 0;
  for (size_t i = 0; i < order.size() && i < 10; ++i) {
    const double gain = 1.0 / std::log2(static_cast<double>(i) + 2.0);
    if (relevance[order[i]] > 0) {
      if (reciprocal_rank == 0) reciprocal_rank = 1.0 / static_cast<double>(i + 1);
      dcg += gain;
    }
    if (static_cast<int64_t>(i) < positives) ideal += gain;
  }
  ++groups_;
  reciprocal_ranks_ += reciprocal_rank;
  ndcgs_ += dcg / ideal;
}

RankingMetrics RankingEvaluator::Metrics() const {
  RankingMetrics m;
  m.groups = groups_;
  if (groups_ > 0) {
    m.mrr_at_10 = reciprocal_ranks_ / static_cast<double>(groups_);
    m.ndcg_at_10 = ndcgs_ / static_cast<double>(groups_);
  }
  return m;
}

}  // namespace ballast::train
