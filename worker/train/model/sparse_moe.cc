#include "worker/train/model/sparse_moe.h"

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/expert_order.h"
#include "kernels/expert_rows.h"
#include "kernels/grouped_linear.h"
#include "kernels/lora_update.h"
#include "kernels/swiglu.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/expert_exchange.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/load_balancing.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

// y (N, out) of the experts' projections `modules` side by side (gate_proj
// and up_proj, or down_proj) for rows x (N, in) in expert order, plus the
// LoRA update scaling * B_e A_e x of each adapted module, per row's expert e
// (as Decoder::Project does for a dense projection, lora_update.h).
at::Tensor AddExpertAdapters(const Decoder& decoder, const std::string& experts,
                             const std::vector<std::string>& modules, const at::Tensor& x,
                             at::Tensor y, const at::Tensor& offsets, bool training) {
  const std::optional<LoraConfig>& lora = decoder.lora();
  if (!lora) return y;
  const int64_t width = y.size(1) / static_cast<int64_t>(modules.size());  // each module's out
  std::vector<at::Tensor> a_weights, downs, ups;
  std::vector<int64_t> out_begins;
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string module = experts + modules[i];
    if (!decoder.HasTensor(module + ".lora_A.weight")) continue;
    at::Tensor a = decoder.Weight(module + ".lora_A.weight");  // (E, r, in)
    // With dropout each module draws its own mask, in module order, as PEFT does.
    if (lora->lora_dropout > 0) {
      downs.push_back(
          kernels::grouped_linear(at::dropout(x, lora->lora_dropout, training), a, offsets));
    }
    a_weights.push_back(std::move(a));
    ups.push_back(decoder.Weight(module + ".lora_B.weight"));  // (E, out, r)
    out_begins.push_back(static_cast<int64_t>(i) * width);
  }
  if (ups.empty()) return y;
  // Without dropout the modules share x, so their A's are one grouped product.
  const at::Tensor down = lora->lora_dropout > 0
                              ? at::cat(downs, 1)
                              : kernels::grouped_linear(x, at::cat(a_weights, 1), offsets);
  return kernels::add_grouped_lora_update(y, down, ups, out_begins, offsets, lora->scaling());
}

// The router's logits (T, E) in fp32, with its adapter (in fp32 too) when
// LoRA targets "gate".
at::Tensor RouterLogits(const Decoder& decoder, const std::string& prefix, const at::Tensor& x,
                        bool training) {
  const at::Tensor x32 = x.to(at::kFloat);
  at::Tensor logits = at::linear(x32, decoder.Weight(prefix + "gate.weight", at::kFloat));
  const std::optional<LoraConfig>& lora = decoder.lora();
  if (!lora || !decoder.HasTensor(prefix + "gate.lora_A.weight")) return logits;
  const at::Tensor down = at::linear(at::dropout(x32, lora->lora_dropout, training),
                                     decoder.Weight(prefix + "gate.lora_A.weight", at::kFloat));
  return logits + at::linear(down, decoder.Weight(prefix + "gate.lora_B.weight", at::kFloat)) *
                      lora->scaling();
}

}  // namespace

at::Tensor SparseMoe(const Decoder& decoder, int64_t layer, const at::Tensor& x, bool training) {
  const MoeConfig& moe = decoder.config().moe;
  const std::string prefix = LayerPrefix(layer) + "mlp.";
  const std::string experts = ExpertsPrefix(layer);
  const std::shared_ptr<RoutingStats>& routing = decoder.routing();

  at::Tensor logits = RouterLogits(decoder, prefix, x, training);  // (T, E) fp32
  if (routing) logits = BalanceRouterLogits(logits, routing, layer);
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);
  at::Tensor weights, selected;  // (T, k), (T, k) int64
  if (const RoutingBias* bias = decoder.routing_bias()) {
    // aux_free: the bias steers which experts are chosen; their weights
    // stay the unbiased probabilities (DeepSeek-V3 gates with the scores,
    // not the biased scores).
    selected = std::get<1>(at::topk(probs.detach() + bias->of(layer), moe.top_k, -1));
    weights = probs.gather(-1, selected);
  } else {
    std::tie(weights, selected) = at::topk(probs, moe.top_k, -1);
  }
  if (moe.norm_topk_prob) weights = weights / weights.sum(-1, /*keepdim=*/true);
  weights = weights.to(x.scalar_type());
  if (routing) routing->Record(layer, selected, probs, logits);

  // The (token, choice) rows in expert order; each expert's rows are a
  // contiguous segment that ends at offsets[e].
  const kernels::ExpertOrder order = kernels::SortByExpert(selected, moe.num_experts);
  at::Tensor rows = kernels::gather_expert_rows(x, order);  // (T k, H)
  at::Tensor offsets = order.offsets;
  // Expert parallelism: the rows go to their experts' ranks, and this rank
  // computes its own experts' rows from every rank.
  std::optional<ExpertExchange> exchange;
  if (Collectives* group = decoder.expert_group()) {
    exchange.emplace(group, order.counts);
    rows = exchange->Dispatch(rows);
    offsets = exchange->local_offsets();
  }
  // Gate and up adapted apart (Qwen3-MoE's per-expert linears), or as one
  // parameter (Qwen3.5-MoE's, PEFT's target_parameters: one A for both).
  const bool fused_adapter = decoder.HasTensor(experts + "gate_up_proj.lora_A.weight");
  const at::Tensor gate_up = AddExpertAdapters(
      decoder, experts,
      fused_adapter ? std::vector<std::string>{"gate_up_proj"}
                    : std::vector<std::string>{"gate_proj", "up_proj"},
      rows, kernels::grouped_linear(rows, decoder.Weight(experts + "gate_up_proj"), offsets),
      offsets, training);                              // (T k, 2I)
  const at::Tensor hidden = kernels::swiglu(gate_up);  // (T k, I)
  at::Tensor out_rows = AddExpertAdapters(
      decoder, experts, {"down_proj"}, hidden,
      kernels::grouped_linear(hidden, decoder.Weight(experts + "down_proj"), offsets), offsets,
      training);  // (T k, H)
  if (exchange) out_rows = exchange->Combine(out_rows);

  // Each row weighted by its choice's routing weight, then summed into its
  // token in expert order, as HF adds them.
  const at::Tensor routed = kernels::combine_expert_rows(out_rows, weights, order);
  if (moe.shared_expert_intermediate_size == 0) return routed;

  // Qwen3.5-MoE's shared expert, a dense SwiGLU MLP that every token goes
  // through, scaled per token by its gate; its linears take LoRA by their
  // short names, as any dense MLP's.
  const std::string shared = prefix + "shared_expert.";
  const at::Tensor shared_out = decoder.Project(
      shared, {"down_proj"},
      kernels::swiglu(decoder.Project(shared, {"gate_proj", "up_proj"}, x, training)), training);
  const at::Tensor gate = decoder.Project(prefix, {"shared_expert_gate"}, x, training);  // (T, 1)
  return routed + at::sigmoid(gate) * shared_out;
}

}  // namespace ballast::train
