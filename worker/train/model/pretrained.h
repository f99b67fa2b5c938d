// Loading an HF model folder's weights into a ParamStore.
#ifndef BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_
#define BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

// Loads the safetensors checkpoint of an HF model folder (one file, or shards
// with their index) into a new ParamStore, in fp32, under the decoder's names
// (tensor_names.h), checking every tensor's shape against `config`: per
// layer the tensors of its token mixer (config.layer_types). With
// `trainable`, every base tensor is trainable (full finetuning). NOT_FOUND
// names a missing tensor, FAILED_PRECONDITION a tensor whose shape disagrees
// with config.json; the safetensors reader's errors name the file.
//
// kMapped leaves each tensor a read-only view of the mapped file, in the
// file's dtype, for a caller that copies only what it keeps: a rank of a
// sharded job reads its own ranges, so no rank ever holds the whole model.
// Experts the checkpoint keeps one by one stay its pieces there
// (ParamStore::AddPieces), not stacked into a copy.
enum class PretrainedTensors { kOwnedFp32, kMapped };
absl::StatusOr<ParamStore> LoadPretrained(
    const std::string& dir, const ModelConfig& config, bool trainable,
    PretrainedTensors tensors = PretrainedTensors::kOwnedFp32);

// The checkpoint names of `dir`'s tensors that are not the decoder's (the
// vision tower model.visual.* and multi-token-prediction head mtp.* of
// Qwen3.5's vision-language checkpoint), in name order; empty when there are
// none or the checkpoint cannot be opened (LoadPretrained reports that).
std::vector<std::string> TensorsOutsideDecoder(const std::string& dir, const ModelConfig& config);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_PRETRAINED_H_
