// Forward-only evaluation: the logits of a model (optionally with a PEFT
// adapter) on tokenized documents. Used to check a trained model against
// other implementations, and by `ballast-train logits`.
#ifndef BALLAST_WORKER_TRAIN_MODEL_INFERENCE_H_
#define BALLAST_WORKER_TRAIN_MODEL_INFERENCE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

// A model for forward passes only: its config, its frozen weights, and the
// PEFT adapter's config when one is folded in through LoRA modules.
struct InferenceModel {
  ModelConfig config;
  ParamStore params;
  std::optional<LoraConfig> lora;
};

// `model_dir` (an HF folder) with the PEFT adapter of `adapter_dir` (may be
// empty). Errors name the folder or file at fault.
absl::StatusOr<InferenceModel> LoadInferenceModel(const std::string& model_dir,
                                                  const std::string& adapter_dir);

// Reads documents from `tokens_path` (JSONL with input_ids, and labels
// where given), packs them, and writes `out_path` (safetensors) with
// "logits" (T, V) fp32 and "cu_seqlens"; for a mixture of experts also each
// sparse layer's router logits, "router_logits.<layer>" (T, E) fp32, and
// "aux_loss" (1), the load-balancing loss of the packed documents as one
// forward (load_balancing.h, without its coefficient). With `gradients`,
// also the gradient of the summed next-token cross-entropy of the packed
// documents (fp32), plus router_aux_loss_coef * aux_loss for a mixture of
// experts, with respect to every adapter tensor, or every base tensor
// without an adapter, as "grad." + the tensor's checkpoint name (per expert
// for stacked experts): a parity test's view of the backward pass, parameter
// by parameter. `adapter_dir` may be empty. Errors name the folder or file
// at fault.
absl::Status WriteLogits(const std::string& model_dir, const std::string& adapter_dir,
                         const std::string& tokens_path, const std::string& out_path,
                         bool gradients = false);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_INFERENCE_H_
