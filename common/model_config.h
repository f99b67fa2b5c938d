// ModelConfig: the decoder's shape and numerics, read from an HF config.json.
//
// Supported model_type: kSupportedModelTypes (common/model_types.h, the list
// submission checks too: llama, qwen2, qwen3, sdar, qwen3_5, qwen3_5_text,
// qwen3_moe, sdar_moe, qwen3_5_moe, qwen3_5_moe_text). Anything the decoder
// does not implement (an unknown model_type, hidden_act other than silu, a
// rope_scaling type other than linear/llama3/default, a layer type other than
// full_attention/linear_attention, Qwen3.5's attn_output_gate false,
// mixture-of-experts keys outside the MoE families, a missing required key, a
// value of the wrong type or out of range, sizes that do not divide) is an
// INVALID_ARGUMENT that names the key, so a model never runs with a silently
// ignored setting. Submission parses it too (common/job_spec_files.cc), so
// ballastd refuses what the trainer would.
//
// Qwen3.5 (transformers 5.x, models/qwen3_5): the released checkpoints are the
// vision-language wrapper (model_type qwen3_5), whose decoder keys sit in
// text_config and whose decoder tensors sit under model.language_model.; the
// trainer reads that decoder only. Its layers are hybrid (layer_types): Gated
// DeltaNet ("linear_attention") or gated softmax attention ("full_attention").
// Qwen3.5-MoE (models/qwen3_5_moe: qwen3_5_moe, the wrapper, and
// qwen3_5_moe_text) is that decoder with a mixture of experts in every layer.
#ifndef BALLAST_COMMON_MODEL_CONFIG_H_
#define BALLAST_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast {

struct RopeScaling {
  // "default" (none), "linear" or "llama3".
  std::string type = "default";
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// A decoder layer's token mixer, HF's layer_types entry.
enum class TokenMixer {
  kAttention,      // "full_attention": softmax attention
  kGatedDeltaNet,  // "linear_attention": Gated DeltaNet (Qwen3.5)
};

// The Gated DeltaNet layers' sizes (HF's linear_* keys).
struct GatedDeltaNetConfig {
  int64_t num_key_heads = 0;    // linear_num_key_heads (q and k)
  int64_t num_value_heads = 0;  // linear_num_value_heads, a multiple of num_key_heads
  int64_t key_head_dim = 0;     // linear_key_head_dim
  int64_t value_head_dim = 0;   // linear_value_head_dim
  int64_t conv_kernel = 0;      // linear_conv_kernel_dim, the causal conv1d's width

  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  // Channels of in_proj_qkv and of the conv: q | k | v.
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// Qwen3-MoE's sparse layers (transformers 4.57.6 Qwen3MoeConfig, whose
// defaults stand in for absent keys). A sparse layer's MLP is a router over
// num_experts SwiGLU experts of moe_intermediate_size, top_k of them per token.
// Qwen3.5-MoE's (transformers 5.23 Qwen3_5MoeTextConfig) are every layer,
// always renormalise the top k, and add a shared expert gated per token.
struct MoeConfig {
  int64_t num_experts = 0;            // 0: every layer is dense
  int64_t top_k = 0;                  // num_experts_per_tok, <= num_experts
  int64_t moe_intermediate_size = 0;  // each expert's SwiGLU width
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;  // layers kept dense whatever the step
  bool norm_topk_prob = false;           // renormalise the top-k probabilities to sum 1
  // Qwen3.5-MoE: a dense SwiGLU expert of this width that every token goes
  // through, scaled by sigmoid(shared_expert_gate(x)), added to the routed
  // experts' output; 0: none (Qwen3-MoE).
  int64_t shared_expert_intermediate_size = 0;
  // The load-balancing loss's weight. transformers adds it only when
  // output_router_logits is true (false in the released configs); Ballast
  // adds it whenever it is > 0, and accepts output_router_logits without
  // reading it, so that a finetune of a released checkpoint keeps balancing
  // its experts (README, Mixture of Experts).
  double router_aux_loss_coef = 0.0;

  // HF's rule: layer i is sparse when the model has experts, i is not in
  // mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
  bool sparse(int64_t layer) const;
};

struct ModelConfig {
  // llama | qwen2 | qwen3 | sdar (Qwen3's decoder) | qwen3_5 | qwen3_5_text | qwen3_moe |
  // sdar_moe | qwen3_5_moe | qwen3_5_moe_text
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // the dense MLPs' width; 0 when every layer is sparse
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // explicit when given; else hidden_size / heads
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v biases: qwen2 always, llama when set
  bool mlp_bias = false;        // llama's mlp_bias; must be false (unsupported otherwise)
  bool qk_norm = false;         // qwen3: per-head RMSNorm on q and k before RoPE

  // RoPE rotates the first rotary_dim channels of each head and passes the
  // rest through: head_dim * partial_rotary_factor (int, as HF), even.
  int64_t rotary_dim = 0;
  // Qwen3.5's attention: q_proj gives each head's query and an output gate,
  // [query (head_dim) | gate (head_dim)] per head; out * sigmoid(gate) before o_proj.
  bool attention_output_gate = false;
  // Qwen3.5's RMSNorms (input, post-attention, final, q_norm, k_norm) scale by
  // 1 + weight, in fp32, rounding once (weight initialised to 0).
  bool zero_centred_norm = false;
  // One token mixer per layer (HF layer_types); kAttention everywhere for the
  // dense families.
  std::vector<TokenMixer> layer_types;
  GatedDeltaNetConfig linear_attention;  // set when any layer is kGatedDeltaNet
  MoeConfig moe;  // qwen3_moe, sdar_moe, qwen3_5_moe(_text); num_experts 0 elsewhere
  // Where the checkpoint keeps the decoder's tensors that the trainer names
  // "model.*": "model." itself, or "model.language_model." in Qwen3.5's
  // vision-language checkpoint (lm_head.weight is at the root in both).
  std::string tensor_prefix = "model.";

  // True when some layer is Gated DeltaNet.
  bool has_linear_attention() const;
  // True when some layer is a mixture of experts.
  bool has_experts() const;
};

// Parses the text of a config.json.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);
// Reads and parses `dir/config.json`; NOT_FOUND names the file when absent.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace ballast

#endif  // BALLAST_COMMON_MODEL_CONFIG_H_
