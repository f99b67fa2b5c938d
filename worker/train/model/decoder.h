// Decoder: the Llama / Qwen2 / Qwen3 / Qwen3.5 decoder-only transformer on
// packed, variable-length batches, reading every tensor from a ParamStore.
//
//   h = embed(input_ids)                                   (T, H)
//   per layer: h += mixer(norm(h))     the layer's token mixer (layer_types):
//                                      softmax attention (attention_mixer.h,
//                                      with Qwen3.5's output gate and partial
//                                      RoPE) or Gated DeltaNet (gated_delta_net.h)
//              h += down(silu(gate(x)) * up(x))           x = norm(h), a dense MLP,
//                                                          or a mixture of experts
//                                                          (sparse_moe.h) in the
//                                                          layers config.moe.sparse()
//   hidden = norm(h)                                       (T, H)
// RMSNorm computes in fp32 and casts back (zero-centred, 1 + w, for Qwen3.5);
// RoPE is rotate-half over the first rotary_dim channels of each head; GQA
// repeats kv heads inside the attention kernel; Qwen3 and Qwen3.5 apply
// per-head q_norm / k_norm before RoPE. Attention goes through kernels/ with
// the batch's mask (causal or block diffusion, never a dense mask); Gated
// DeltaNet restarts its conv window and state at every document boundary.
// The decoder stops at the hidden states: what is trained on them (the loss)
// is the objective's (worker/train/objective/).
//
// Thread-compatible: a const Decoder may run forwards from several threads
// only if the ParamStore is not written meanwhile; the trainer uses one.
#ifndef BALLAST_WORKER_TRAIN_MODEL_DECODER_H_
#define BALLAST_WORKER_TRAIN_MODEL_DECODER_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/model_config.h"
#include "kernels/attention.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/data/packed_batch.h"
#include "worker/train/model/load_balancing.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/param_store.h"
#include "worker/train/model/routing_bias.h"

namespace ballast::train {

class Decoder;

// Runs one decoder layer in the decoder's forward. The decoder runs its
// layers itself when it has none; a sharded model (worker/train/shard/) is
// one, gathering the layer's parameters around it.
class LayerRunner {
 public:
  virtual ~LayerRunner() = default;
  virtual at::Tensor RunLayer(const Decoder& decoder, int64_t layer, const at::Tensor& h,
                              const at::Tensor& cos, const at::Tensor& sin,
                              const kernels::AttentionMask& mask, bool training) = 0;
  // Runs `forwards`, which call decoder.LayerForward(layer, ...) without
  // autograd, with the layer's parameters at hand, in a pass whose last
  // layer is `last` (nothing past it is fetched): a sharded model gathers the
  // layer once for all of them.
  virtual void WithLayer(int64_t layer, int64_t last, const std::function<void()>& forwards) = 0;
};

class Decoder {
 public:
  // `params` must outlive the decoder, and its tensors stay on one device,
  // where the decoder computes. `lora` is set for LoRA jobs. compute_dtype
  // is kFloat or kBFloat16 (bf16 compute over fp32 masters).
  Decoder(ModelConfig config, const ParamStore* params, std::optional<LoraConfig> lora,
          at::ScalarType compute_dtype, bool gradient_checkpointing);

  // Hands every layer to `runner` (not owned; nullptr: the decoder's own).
  void set_layer_runner(LayerRunner* runner) { layer_runner_ = runner; }
  // Where the sparse layers of the forwards from now on record their routing
  // and find the load-balancing loss's weight (load_balancing.h); nullptr:
  // they record nothing and add no loss. The caller sets one per forward.
  void set_routing(std::shared_ptr<RoutingStats> routing) { routing_ = std::move(routing); }
  const std::shared_ptr<RoutingStats>& routing() const { return routing_; }
  // The per-expert bias the sparse layers add to their router probabilities
  // for the top-k choice (routing_bias.h; moe.balance aux_free); nullptr:
  // none. Not owned; it must outlive the forwards.
  void set_routing_bias(const RoutingBias* bias) { routing_bias_ = bias; }
  const RoutingBias* routing_bias() const { return routing_bias_; }
  // Expert parallelism (moe.expert_parallel): the ranks the experts are
  // split over, each holding E / N of them as its experts tensors, which the
  // sparse layers send their rows to (expert_exchange.h); nullptr: every
  // expert is at hand. Not owned.
  void set_expert_group(Collectives* group) { expert_group_ = group; }
  Collectives* expert_group() const { return expert_group_; }

  // Final-normed hidden states, (T, H) in the compute dtype, differentiable
  // in every trainable tensor. `training` turns LoRA dropout on.
  at::Tensor HiddenStates(const PackedBatch& batch, bool training) const;
  // The routing pre-pass of global balancing (docs/moe-balancing.md): runs
  // `batches` without autograd through layers 0..last, routing[i] recording
  // batches[i]'s routing, each layer on every batch before the next layer,
  // so that a sharded model gathers each layer once for them all. Each batch's
  // dropout draws then interleave with the others': only a forward that draws
  // none (no LoRA dropout, or !training) routes as its own forward does when
  // more than one batch is given.
  void Route(const std::vector<const PackedBatch*>& batches,
             const std::vector<std::shared_ptr<RoutingStats>>& routing, int64_t last,
             bool training);
  // (T, V) fp32 logits; for evaluation and parity checks only.
  at::Tensor Logits(const PackedBatch& batch) const;

  // One decoder layer, (T, H) -> (T, H). Public for the checkpointing function.
  at::Tensor LayerForward(int64_t layer, const at::Tensor& h, const at::Tensor& cos,
                          const at::Tensor& sin, const kernels::AttentionMask& mask,
                          bool training) const;

  const ModelConfig& config() const { return config_; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }
  at::ScalarType compute_dtype() const { return compute_dtype_; }
  // The fp32 master of the output projection (the embeddings when tied), (V, H).
  const at::Tensor& lm_head_weight() const;

  // How the token mixers (attention_mixer.h, gated_delta_net.h) read their
  // weights. The tensor under `name` in the compute dtype (a differentiable cast).
  at::Tensor Weight(const std::string& name) const;
  // The same in `dtype` (the router computes in fp32 whatever the compute dtype).
  at::Tensor Weight(const std::string& name, at::ScalarType dtype) const;
  bool HasTensor(const std::string& name) const { return params_->contains(name); }
  const std::optional<LoraConfig>& lora() const { return lora_; }
  // x (T, in) through the linear modules prefix + modules[i] (e.g. q_proj,
  // k_proj, v_proj of one layer) with their LoRA adapters: one GEMM over the
  // concatenated weights and one over the adapters, so the products are fewer
  // and wider, and x's gradient arrives as one tensor rather than a sum over
  // modules. Returns (T, sum out_i), the modules' outputs side by side.
  at::Tensor Project(const std::string& prefix, const std::vector<std::string>& modules,
                     const at::Tensor& x, bool training) const;
  // RMSNorm of x over its last dimension with the weight `weight_name`,
  // zero-centred (1 + w) when the config says so; x's sizes and dtype.
  at::Tensor Norm(const at::Tensor& x, const std::string& weight_name) const;

 private:
  // What every layer of a batch's forward reads besides h: the rotary cos and
  // sin (T, rotary_dim) and the attention mask.
  struct LayerInputs {
    at::Tensor cos;
    at::Tensor sin;
    kernels::AttentionMask mask;
  };
  LayerInputs InputsOf(const PackedBatch& batch) const;
  at::Tensor Embed(const PackedBatch& batch) const;

  ModelConfig config_;
  const ParamStore* params_;
  std::optional<LoraConfig> lora_;
  at::ScalarType compute_dtype_;
  bool gradient_checkpointing_;
  LayerRunner* layer_runner_ = nullptr;
  std::shared_ptr<RoutingStats> routing_;
  const RoutingBias* routing_bias_ = nullptr;
  Collectives* expert_group_ = nullptr;
  at::Tensor inv_freq_;  // (rotary_dim / 2) fp32 on the params' device, with rope_scaling applied
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_DECODER_H_
