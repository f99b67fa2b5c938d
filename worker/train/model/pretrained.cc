#include "worker/train/model/pretrained.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {

absl::StatusOr<ParamStore> LoadPretrained(const std::string& dir, const ModelConfig& c,
                                          bool trainable, PretrainedTensors tensors) {
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  ParamStore store;
  const int64_t q_out = c.num_attention_heads * c.head_dim;
  const int64_t kv_out = c.num_key_value_heads * c.head_dim;
  const GatedDeltaNetConfig& g = c.linear_attention;
  absl::Status status;
  // `name` is the decoder's (tensor_names.h); the checkpoint may keep it
  // elsewhere, or per expert (expert_layout.h).
  auto load = [&](const std::string& name, std::vector<int64_t> shape, int64_t layer) {
    if (!status.ok()) return;
    // Mapped experts stay the checkpoint's pieces: each rank copies its share.
    if (tensors == PretrainedTensors::kMapped && PiecesOf(c, name).stacked) {
      absl::StatusOr<std::vector<at::Tensor>> pieces =
          ReadParamPieces(*ckpt, c, name, shape, /*key_prefix=*/"", dir);
      if (pieces.ok()) {
        store.AddPieces(name, shape, *std::move(pieces), layer, trainable);
      } else {
        status = pieces.status();
      }
      return;
    }
    absl::StatusOr<at::Tensor> t = ReadParam(*ckpt, c, name, shape, /*key_prefix=*/"", dir);
    if (!t.ok()) {
      status = t.status();
      return;
    }
    // Own an fp32 copy: the mapping is read-only and masters are fp32 (a
    // stacked tensor is one already). Mapped, keep the view.
    const bool owned = tensors == PretrainedTensors::kMapped || PiecesOf(c, name).stacked;
    store.Add(name, owned ? *t : t->to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true), layer,
              trainable);
  };
  load("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, ParamStore::kNoLayer);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = LayerPrefix(i);
    load(p + "input_layernorm.weight", {c.hidden_size}, i);
    if (c.layer_types[i] == TokenMixer::kGatedDeltaNet) {
      const std::string a = p + "linear_attn.";
      load(a + "in_proj_qkv.weight", {g.conv_dim(), c.hidden_size}, i);
      load(a + "in_proj_z.weight", {g.value_dim(), c.hidden_size}, i);
      load(a + "in_proj_b.weight", {g.num_value_heads, c.hidden_size}, i);
      load(a + "in_proj_a.weight", {g.num_value_heads, c.hidden_size}, i);
      load(a + "conv1d.weight", {g.conv_dim(), 1, g.conv_kernel}, i);
      load(a + "A_log", {g.num_value_heads}, i);
      load(a + "dt_bias", {g.num_value_heads}, i);
      load(a + "norm.weight", {g.value_head_dim}, i);
      load(a + "out_proj.weight", {c.hidden_size, g.value_dim()}, i);
    } else {
      // With the output gate, q_proj gives each head's query and gate.
      load(p + "self_attn.q_proj.weight",
           {c.attention_output_gate ? 2 * q_out : q_out, c.hidden_size}, i);
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
    }
    load(p + "post_attention_layernorm.weight", {c.hidden_size}, i);
    if (c.moe.sparse(i)) {
      const int64_t experts = c.moe.num_experts, width = c.moe.moe_intermediate_size;
      load(p + "mlp.gate.weight", {experts, c.hidden_size}, i);
      load(ExpertsPrefix(i) + "gate_up_proj", {experts, 2 * width, c.hidden_size}, i);
      load(ExpertsPrefix(i) + "down_proj", {experts, c.hidden_size, width}, i);
      if (const int64_t shared = c.moe.shared_expert_intermediate_size; shared > 0) {
        load(p + "mlp.shared_expert.gate_proj.weight", {shared, c.hidden_size}, i);
        load(p + "mlp.shared_expert.up_proj.weight", {shared, c.hidden_size}, i);
        load(p + "mlp.shared_expert.down_proj.weight", {c.hidden_size, shared}, i);
        load(p + "mlp.shared_expert_gate.weight", {1, c.hidden_size}, i);
      }
    } else {
      load(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, i);
      load(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, i);
      load(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, i);
    }
  }
  load("model.norm.weight", {c.hidden_size}, ParamStore::kNoLayer);
  if (!c.tie_word_embeddings) {
    load("lm_head.weight", {c.vocab_size, c.hidden_size}, ParamStore::kNoLayer);
  }
  if (!status.ok()) return status;
  return store;
}

std::vector<std::string> TensorsOutsideDecoder(const std::string& dir, const ModelConfig& config) {
  absl::StatusOr<SafetensorsCheckpoint> ckpt = SafetensorsCheckpoint::Open(dir);
  std::vector<std::string> out;
  if (!ckpt.ok()) return out;
  for (const std::string& name : ckpt->names()) {
    if (ParamName(config, name).empty()) out.push_back(name);
  }
  return out;
}

}  // namespace ballast::train
