// ModelConfig: the decoder's shape and numerics, read from an HF config.json.
//
// Supported model_type: kSupportedModelTypes (common/model_types.h, the list
// submission checks too: llama, qwen2, qwen3, sdar). Anything the decoder does
// not implement (an unknown model_type, hidden_act other than silu, a
// rope_scaling type other than linear/llama3/default, a missing required key,
// a value of the wrong type or out of range) is an INVALID_ARGUMENT that names
// the key, so a model never runs with a silently ignored setting. Submission
// parses it too (common/job_spec_files.cc), so ballastd refuses what the
// trainer would.
#ifndef BALLAST_COMMON_MODEL_CONFIG_H_
#define BALLAST_COMMON_MODEL_CONFIG_H_

#include <cstdint>
#include <string>

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

struct ModelConfig {
  std::string model_type;  // llama | qwen2 | qwen3 | sdar (Qwen3's decoder)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
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
};

// Parses the text of a config.json.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);
// Reads and parses `dir/config.json`; NOT_FOUND names the file when absent.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir);

}  // namespace ballast

#endif  // BALLAST_COMMON_MODEL_CONFIG_H_
