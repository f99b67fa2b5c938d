// The MLP of a mixture-of-experts layer (transformers 4.57.6's
// Qwen3MoeSparseMoeBlock, and 5.23's Qwen3_5MoeSparseMoeBlock), dropless:
//
//   logits = x W_router^T                       (T, E), fp32 (x and the router widened)
//   p      = softmax(logits)                    fp32
//   w, idx = topk(p, k)                         torch.topk's order; w / sum(w) when
//                                               norm_topk_prob (always for
//                                               Qwen3.5-MoE); w in the compute dtype
//            (moe.balance aux_free: idx = topk(p + b, k) with the layer's
//            routing bias b, w = p[idx]; routing_bias.h)
//   out[t] = sum_j w[t, j] * expert_{idx[t, j]}(x[t]),
//            expert_e(x) = down_e(silu(gate_e(x)) * up_e(x))
//   out[t] += sigmoid(x[t] W_sg^T) shared(x[t]) Qwen3.5-MoE: shared_expert, a SwiGLU of
//                                               shared_expert_intermediate_size;
//                                               W_sg (1, H), shared_expert_gate
//
// The T * k (token, choice) rows are sorted by expert (kernels/expert_order.h)
// and each projection is one grouped GEMM over the experts' contiguous
// segments (kernels/grouped_linear.h): no loop over experts, no capacity, no
// token dropped. The rows are scattered back to their tokens by index_add,
// whose backward gathers through the same permutation. An expert no token
// chose takes part with no rows, and its gradient is zero, not undefined, at
// any world size and accumulation (HF leaves such a gradient None and AdamW
// skips the tensor; the README names the difference).
//
// LoRA: gate_proj / up_proj / down_proj adapt every expert (per-expert A and B,
// stacked as the weights are, expert_layout.h, and computed by the same
// grouped GEMMs); "gate" adapts the router, in fp32. In Qwen3.5-MoE they
// name the shared expert's linears instead, and "shared_expert_gate" its
// gate, as PEFT names them on transformers 5.23 (lora.cc).
//
// Under expert parallelism (moe.expert_parallel) the decoder's experts
// tensors hold this rank's E / N experts, and the sorted rows go to their
// experts' ranks and back around the grouped GEMMs (expert_exchange.h).
//
// The routing is recorded for the load-balancing loss (load_balancing.h)
// when the decoder has a RoutingStats, and the logits pass through
// BalanceRouterLogits so that its gradient reaches the router.
#ifndef BALLAST_WORKER_TRAIN_MODEL_SPARSE_MOE_H_
#define BALLAST_WORKER_TRAIN_MODEL_SPARSE_MOE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::train {

class Decoder;

// x (T, H), the normed input of sparse layer `layer`'s MLP in the compute
// dtype. Returns (T, H), differentiable in x, the router, every expert and
// their adapters.
at::Tensor SparseMoe(const Decoder& decoder, int64_t layer, const at::Tensor& x, bool training);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_SPARSE_MOE_H_
