#include "worker/train/model/pretrained.h"

#include <torch/torch.h>

#include <sstream>

#include "absl/strings/str_cat.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {

absl::StatusOr<ParamStore> LoadPretrained(const std::string& dir, const ModelConfig& c,
                                          bool trainable, PretrainedTensors tensors) {
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  ParamStore store;
  const int64_t q_out = c.num_attention_heads * c.head_dim;
  const int64_t kv_out = c.num_key_value_heads * c.head_dim;
  absl::Status status;
  auto load = [&](const std::string& name, std::vector<int64_t> shape, int64_t layer) {
    if (!status.ok()) return;
    absl::StatusOr<at::Tensor> t = ckpt->tensor(name);
    if (!t.ok()) {
      status = absl::NotFoundError(absl::StrCat(dir, ": checkpoint has no tensor ", name));
      return;
    }
    if (t->sizes() != at::IntArrayRef(shape)) {
      std::ostringstream msg;
      msg << dir << ": tensor " << name << " has shape " << t->sizes() << ", config.json implies "
          << at::IntArrayRef(shape);
      status = absl::FailedPreconditionError(msg.str());
      return;
    }
    // Own an fp32 copy: the mapping is read-only and masters are fp32.
    store.Add(name,
              tensors == PretrainedTensors::kMapped
                  ? *t
                  : t->to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true),
              layer, trainable);
  };
  load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, ParamStore::kNoLayer);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = LayerPrefix(i);
    load(p + "input_layernorm.weight", {c.hidden_size}, i);
    load(p + "self_attn.q_proj.weight", {q_out, c.hidden_size}, i);
    load(p + "self_attn.k_proj.weight", {kv_out, c.hidden_size}, i);
    load(p + "self_attn.v_proj.weight", {kv_out, c.hidden_size}, i);
    if (c.attention_bias) {
      load(p + "self_attn.q_proj.bias", {q_out}, i);
      load(p + "self_attn.k_proj.bias", {kv_out}, i);
      load(p + "self_attn.v_proj.bias", {kv_out}, i);
    }
    load(p + "self_attn.o_proj.weight", {c.hidden_size, q_out}, i);
    if (c.qk_norm) {
      load(p + "self_attn.q_norm.weight", {c.head_dim}, i);
      load(p + "self_attn.k_norm.weight", {c.head_dim}, i);
    }
    load(p + "post_attention_layernorm.weight", {c.hidden_size}, i);
    load(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, i);
    load(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, i);
    load(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, i);
  }
  load("model.norm.weight", {c.hidden_size}, ParamStore::kNoLayer);
  if (!c.tie_word_embeddings) {
    load("lm_head.weight", {c.vocab_size, c.hidden_size}, ParamStore::kNoLayer);
  }
  if (!status.ok()) return status;
  return store;
}

}  // namespace ballast::train
