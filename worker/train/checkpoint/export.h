// Export of trained weights as an HF model folder that transformers loads
// with from_pretrained: config.json (and tokenizer files) copied from the
// base model, weights in model.safetensors.
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"

namespace ballast::train {

// Writes out_dir/model.safetensors from `tensors` (the decoder's names,
// tensor_names.h, stored under the base checkpoint's names of `config`) and
// copies the base folder's config.json, generation_config.json and tokenizer
// files. Every base tensor outside the decoder (TensorsOutsideDecoder:
// Qwen3.5's model.visual.* and mtp.*) is copied into it unchanged, in its own
// dtype, byte for byte, so that the export loads as the model it came from,
// unless `tensors` has one of that name (the routing bias of moe.balance
// aux_free, routing_bias.h, which a base exported by such a job carries).
absl::Status ExportHfModel(const std::string& base_dir, const std::string& out_dir,
                           const ModelConfig& config,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Beside a LoRA adapter of a moe.balance aux_free job: the routing biases
// (routing_bias.h) by their HF names, which PEFT does not read.
inline constexpr char kRoutingBiasFile[] = "routing_bias.safetensors";

// Writes `biases` to adapter_dir/kRoutingBiasFile and returns its path.
absl::StatusOr<std::string> SaveRoutingBiasBesideAdapter(
    const std::string& adapter_dir, const std::map<std::string, at::Tensor>& biases);

// Folds a PEFT adapter folder into its base model (W + scaling * B @ A) and
// exports the result as a full HF model, with the adapter folder's
// kRoutingBiasFile when it has one. Errors name the folder at fault.
absl::Status ExportMergedLora(const std::string& base_dir, const std::string& adapter_dir,
                              const std::string& out_dir);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_
