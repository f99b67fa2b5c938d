#include "worker/train/model/moe_step_stats.h"

#include <algorithm>
#include <numeric>

namespace ballast::train {

MoeLayerStats SummarizeLayerRouting(const LayerRouting& routing, int64_t top_k) {
  MoeLayerStats stats;
  stats.layer = routing.layer;
  const auto experts = static_cast<int64_t>(routing.load.size());
  if (experts == 0) return stats;
  std::vector<int64_t> order(experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return routing.load[a] > routing.load[b]; });
  const int64_t k = std::clamp<int64_t>(top_k, 0, experts);
  stats.busiest_experts.assign(order.begin(), order.begin() + k);
  stats.idle_expert_fraction =
      static_cast<double>(std::count(routing.load.begin(), routing.load.end(), 0.0)) /
      static_cast<double>(experts);
  const double pairs = std::accumulate(routing.load.begin(), routing.load.end(), 0.0);
  if (pairs <= 0 || routing.tokens <= 0) return stats;
  stats.max_load_ratio = routing.load[order[0]] / (pairs / static_cast<double>(experts));
  double busiest = 0;
  for (int64_t e : stats.busiest_experts) busiest += routing.load[e];
  stats.top_k_share = busiest / pairs;
  stats.router_entropy = routing.entropy_sum / routing.tokens;
  return stats;
}

MoeStepStats SummarizeStepRouting(absl::Span<const LayerRouting> layers, int64_t top_k,
                                  double aux_loss) {
  MoeStepStats stats;
  stats.aux_loss = aux_loss;
  stats.top_k = top_k;
  if (!layers.empty()) stats.num_experts = static_cast<int64_t>(layers.front().load.size());
  for (const LayerRouting& layer : layers) {
    stats.layers.push_back(SummarizeLayerRouting(layer, top_k));
  }
  return stats;
}

double MaxLoadRatio(const MoeStepStats& stats) {
  double ratio = 0;
  for (const MoeLayerStats& layer : stats.layers) ratio = std::max(ratio, layer.max_load_ratio);
  return ratio;
}

}  // namespace ballast::train
