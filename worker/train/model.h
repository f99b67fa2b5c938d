// Decoder: the Llama / Qwen2 / Qwen3 decoder-only transformer on packed,
// variable-length batches, reading every tensor from a ParamStore.
//
//   h = embed(input_ids)                                   (T, H)
//   per layer: h += o_proj(attention(rope(q), rope(k), v)) with RMSNorm before,
//              h += down(silu(gate(x)) * up(x))           with RMSNorm before
//   hidden = norm(h)                                       (T, H)
// RMSNorm computes in fp32 and casts back; RoPE is rotate-half; GQA repeats kv
// heads inside the attention kernel; Qwen3 applies per-head q_norm / k_norm
// before RoPE. Attention and the loss go through kernels/ (no dense mask, no
// (T, V) logits).
#ifndef BALLAST_WORKER_TRAIN_MODEL_H_
#define BALLAST_WORKER_TRAIN_MODEL_H_

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/loss.h"
#include "worker/train/lora.h"
#include "worker/train/model_config.h"
#include "worker/train/param_store.h"

namespace ballast::train {

// Documents packed along one token axis, with next-token targets.
struct PackedBatch {
  at::Tensor input_ids;     // (T) int64
  at::Tensor position_ids;  // (T) int64, restarting at 0 in each document
  at::Tensor cu_seqlens;    // (docs + 1) int64, document boundaries
  at::Tensor targets;  // (T) int64: the next token, or -100 (unsupervised, or a document's last)
  int64_t supervised_tokens = 0;  // targets != -100
};

// Loads config.json and the safetensors checkpoint of an HF model folder into
// a new ParamStore, in fp32. With `trainable`, every base tensor is trainable
// (full finetuning). Errors name the folder, the file or the missing tensor.
absl::StatusOr<ParamStore> LoadPretrained(const std::string& dir, const ModelConfig& config,
                                          bool trainable);

class Decoder {
 public:
  // `params` must outlive the decoder. `lora` is set for LoRA jobs.
  // compute_dtype is kFloat or kBFloat16 (bf16 compute over fp32 masters).
  Decoder(ModelConfig config, const ParamStore* params, std::optional<LoraConfig> lora,
          at::ScalarType compute_dtype, bool gradient_checkpointing);

  // Final-normed hidden states, (T, H) in the compute dtype.
  at::Tensor hidden_states(const PackedBatch& batch, bool training) const;
  // Sum and count of the token cross-entropy over batch.targets.
  kernels::LossSum loss(const PackedBatch& batch, bool training) const;
  // (T, V) fp32 logits; for evaluation and parity checks only.
  at::Tensor logits(const PackedBatch& batch) const;

  // One decoder layer, (T, H) -> (T, H). Public for the checkpointing function.
  at::Tensor layer_forward(int64_t layer, const at::Tensor& h, const at::Tensor& cos,
                           const at::Tensor& sin, const at::Tensor& cu_seqlens,
                           bool training) const;

  const ModelConfig& config() const { return config_; }
  const at::Tensor& lm_head_weight() const;

 private:
  at::Tensor weight(const std::string& name) const;
  // x (T, in) through the linear modules prefix + modules[i] (e.g. q_proj,
  // k_proj, v_proj of one layer) with their LoRA adapters: one GEMM over the
  // concatenated weights and one over the adapters, so the products are fewer
  // and wider, and x's gradient arrives as one tensor rather than a sum over
  // modules. Returns (T, sum out_i), the modules' outputs side by side.
  at::Tensor project(const std::string& prefix, const std::vector<std::string>& modules,
                     const at::Tensor& x, bool training) const;
  at::Tensor rms_norm(const at::Tensor& x, const std::string& weight_name) const;

  ModelConfig config_;
  const ParamStore* params_;
  std::optional<LoraConfig> lora_;
  at::ScalarType compute_dtype_;
  bool gradient_checkpointing_;
  at::Tensor inv_freq_;  // (head_dim / 2) fp32, with rope_scaling applied
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_H_
