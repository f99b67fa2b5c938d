// Export of trained weights as an HF model folder that transformers loads
// with from_pretrained: config.json (and tokenizer files) copied from the
// base model, weights in model.safetensors.
#ifndef BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_
#define BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace ballast::train {

// Writes out_dir/model.safetensors from `tensors` (HF names) and copies the
// base folder's config.json, generation_config.json and tokenizer files.
absl::Status ExportHfModel(const std::string& base_dir, const std::string& out_dir,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors);

// Folds a PEFT adapter folder into its base model (W + scaling * B @ A) and
// exports the result as a full HF model. Errors name the folder at fault.
absl::Status ExportMergedLora(const std::string& base_dir, const std::string& adapter_dir,
                              const std::string& out_dir);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_CHECKPOINT_EXPORT_H_
