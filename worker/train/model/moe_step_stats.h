// MoeStepStats: what one optimizer step's routing measured in a Mixture-of-
// Experts model, for the metrics (metrics.jsonl, the StepMetrics event,
// Prometheus, the dashboard) and the guard's router-collapse check. The
// trainer fills it from the routing counts it reduces over the step's
// micro-batches and ranks; a dense model has none (no empty series).
//
// A layer's routing over the step's T routed tokens (padding left out), with
// k = num_experts_per_tok and E experts:
//   load_e        (token, choice) pairs routed to expert e; Σ_e load_e = T·k
//   max_load_ratio      max_e load_e / mean_e load_e: 1 when balanced, E/k
//                       when every token goes to the same k experts
//   idle_expert_fraction (#e with load_e = 0) / E
//   router_entropy      mean over tokens of −Σ_e p_e ln p_e, in nats, p the
//                       router's softmax (ln E when uniform, 0 when one-hot)
//   top_k_share         share of the T·k pairs that the k most loaded experts
//                       take: k/E when balanced, 1 when collapsed
//
// Why top_k_share and not "the tokens go to fewer than k experts": a top-k
// router sends every token to k distinct experts, so any set of m < k experts
// holds at most m/k of the pairs, and no share above (k−1)/k can ever sit on
// fewer than k experts. The collapse (issue: "more than s of the tokens go to
// fewer than k experts") is therefore measured at its limit: the smallest set
// of experts that takes more than share s of the pairs has at most k members,
// i.e. top_k_share > s. With s = 0.9 and 128 experts, top-8, a healthy layer
// sits near 8/128 = 0.06.
//
// Thread-compatible; plain numbers, no LibTorch.
#ifndef BALLAST_WORKER_TRAIN_MODEL_MOE_STEP_STATS_H_
#define BALLAST_WORKER_TRAIN_MODEL_MOE_STEP_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ballast::train {

// One MoE layer's routing over a step, summed over micro-batches and ranks.
struct LayerRouting {
  int64_t layer = 0;         // the decoder layer's index
  std::vector<double> load;  // (E): (token, choice) pairs routed to each expert
  double tokens = 0;         // routed tokens T (padding left out)
  double entropy_sum = 0;    // Σ over those tokens of the router's entropy, in nats
};

// What the metrics and the guard read of one layer (see the file comment).
struct MoeLayerStats {
  int64_t layer = 0;
  double max_load_ratio = 0;
  double idle_expert_fraction = 0;
  double router_entropy = 0;
  double top_k_share = 0;
  // The k most loaded experts, most loaded first (ties: lower index first).
  std::vector<int64_t> busiest_experts;
};

struct MoeStepStats {
  // The load-balancing loss of the step, without router_aux_loss_coef (as
  // transformers reports `aux_loss`; the step's loss includes coef × it).
  double aux_loss = 0;
  // Experts per token (k), and experts per layer (E).
  int64_t top_k = 0;
  int64_t num_experts = 0;
  std::vector<MoeLayerStats> layers;  // in layer order
};

// The stats of one layer's routing with `top_k` experts per token. A layer
// that routed no token has a max_load_ratio, entropy and top_k_share of 0,
// and every expert idle.
MoeLayerStats SummarizeLayerRouting(const LayerRouting& routing, int64_t top_k);

// The step's stats from its layers' routings (each of E = load.size()
// experts).
MoeStepStats SummarizeStepRouting(absl::Span<const LayerRouting> layers, int64_t top_k,
                                  double aux_loss);

// The largest max_load_ratio over the layers (the Prometheus gauge); 0 for
// no layers.
double MaxLoadRatio(const MoeStepStats& stats);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_MOE_STEP_STATS_H_
