// RankingMetrics: MRR@10 and NDCG@10 of scored groups of candidates, as
// MTEB's RerankingEvaluator defines them, with binary relevance. Within a
// group, candidates are ranked by score, highest first; a positive that ties
// with a negative ranks after it, so that a model that scores everything the
// same earns nothing.
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_RANKING_METRICS_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_RANKING_METRICS_H_

#include <cstdint>
#include <vector>

namespace ballast::train {

struct RankingMetrics {
  int64_t groups = 0;
  double mrr_at_10 = 0;
  double ndcg_at_10 = 0;
};

// Groups accumulate one at a time; the metrics are their means.
class RankingEvaluator {
 public:
  // One group: the candidates' scores and relevance (> 0: positive). A group
  // without a positive is not counted.
  void AddGroup(const std::vector<double>& scores, const std::vector<float>& relevance);
  RankingMetrics Metrics() const;

 private:
  int64_t groups_ = 0;
  double reciprocal_ranks_ = 0;
  double ndcgs_ = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_RANKING_METRICS_H_
