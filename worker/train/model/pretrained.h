// Loading an HF model folder's weights into a ParamStore.
#ifndef BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_
#define BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_

#include <string>

#include "absl/status/statusor.h"
#include "worker/train/model/model_config.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

// Loads the safetensors checkpoint of an HF model folder into a new
// ParamStore, in fp32, checking every tensor's shape against `config`. With
// `trainable`, every base tensor is trainable (full finetuning). NOT_FOUND
// names a missing tensor, FAILED_PRECONDITION a tensor whose shape disagrees
// with config.json; the safetensors reader's errors name the file.
absl::StatusOr<ParamStore> LoadPretrained(const std::string& dir, const ModelConfig& config,
                                          bool trainable);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_
