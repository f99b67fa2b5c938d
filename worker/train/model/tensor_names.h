// The names of a decoder's tensors. The ParamStore names every tensor as the
// text model's HF checkpoint does ("model.embed_tokens.weight",
// "model.layers.3.linear_attn.A_log", "lm_head.weight"), whatever the
// checkpoint's own layout: one naming for the layers, the sharding, the
// guard's diagnosis and Ballast's checkpoints. A checkpoint that keeps the
// decoder elsewhere (Qwen3.5's vision-language wrapper, under
// "model.language_model.") is mapped at the edges that read and write HF
// files: pretrained loading, export and PEFT adapters.
#ifndef BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_
#define BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model_config.h"

namespace ballast::train {

// "model.layers.<layer>.": the prefix of one decoder layer's tensors.
inline std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

// The checkpoint's name of the decoder tensor `name`: config.tensor_prefix in
// place of a leading "model."; any other name (lm_head.weight) as it is.
inline std::string CheckpointName(const ModelConfig& config, const std::string& name) {
  if (!absl::StartsWith(name, "model.")) return name;
  return absl::StrCat(config.tensor_prefix, name.substr(6));
}

// The decoder's name of checkpoint tensor `name`, or "" when the decoder has
// none by that name's layout (Qwen3.5's model.visual.* and mtp.*).
inline std::string ParamName(const ModelConfig& config, const std::string& name) {
  if (absl::StartsWith(name, config.tensor_prefix)) {
    return absl::StrCat("model.", name.substr(config.tensor_prefix.size()));
  }
  if (absl::StartsWith(name, "model.")) return "";
  return name == "lm_head.weight" ? name : "";
}

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_TENSOR_NAMES_H_
