// Expert layout: where a mixture-of-experts layer's tensors lie in HF files
// and in the ParamStore.
//
// HF checkpoints (transformers 4.57's Qwen3-MoE, and what transformers 5.23's
// save_pretrained writes for Qwen3-MoE and Qwen3.5-MoE) and PEFT adapters keep
// one tensor per expert and projection:
//   model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight
//   base_model.model.model.layers.{i}.mlp.experts.{e}.gate_proj.lora_A.weight
// The ParamStore keeps each projection's experts stacked along a leading
// expert dimension, so that a layer computes them in one grouped GEMM and a
// sharded model gathers them as one bucket, every expert in every step
// (transformers 5's fused layout for the base weights):
//   model.layers.{i}.mlp.experts.gate_up_proj   (E, 2 I, H): gate rows, then up rows
//   model.layers.{i}.mlp.experts.down_proj      (E, H, I)
//   model.layers.{i}.mlp.experts.{gate,up,down}_proj.lora_{A,B}.weight  (E, r, in) / (E, out, r)
// The router (model.layers.{i}.mlp.gate.weight, (E, H)) is one tensor in both.
// A checkpoint may also hold the stacked base tensors themselves (transformers
// 5's in-memory layout, which it loads as they are); ReadParam takes them
// when they are there. Exports are always per expert, what save_pretrained
// writes. The stacking is done and undone only at the edges that read and write HF
// files (pretrained loading, export, PEFT adapters, gradient dumps), as
// tensor_names.h does for the decoder's prefix.
#ifndef BALLAST_WORKER_TRAIN_MODEL_EXPERT_LAYOUT_H_
#define BALLAST_WORKER_TRAIN_MODEL_EXPERT_LAYOUT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/train/io/safetensors.h"

namespace ballast::train {

// "model.layers.<layer>.mlp.experts.": the prefix of a sparse layer's stacked experts.
std::string ExpertsPrefix(int64_t layer);

// The checkpoint tensors the ParamStore tensor `name` is made of: per
// expert, the names whose rows (concatenated along dim 0) are its slice, in
// checkpoint names (tensor_names.h's CheckpointName). A tensor that is not
// stacked is one name; `stacked` says which.
struct CheckpointPieces {
  std::vector<std::vector<std::string>> per_expert;
  bool stacked = false;
};
CheckpointPieces PiecesOf(const ModelConfig& config, const std::string& name);

// The checkpoint tensors (views of the mapped files) whose elements, one
// after another, are the ParamStore tensor `name` of `shape` flattened: its
// pieces in expert order when it is stacked, else the one tensor. Errors as
// ReadParam's. A checkpoint in transformers 5's fused layout holds the
// stacked tensor itself: one piece. A sharded rank copies its ranges of them
// (ParamStore::AddPieces) and never stacks the experts whole.
absl::StatusOr<std::vector<at::Tensor>> ReadParamPieces(
    const SafetensorsCheckpoint& checkpoint, const ModelConfig& config, const std::string& name,
    const std::vector<int64_t>& shape, const std::string& key_prefix, const std::string& where);

// The ParamStore tensor `name` of `shape` read from `checkpoint`, stacked
// from its pieces when it is; `key_prefix` goes before every checkpoint name
// (PEFT's "base_model.model."). A checkpoint that holds the stacked tensor
// under its own name is read in one piece. NOT_FOUND names the first missing piece,
// FAILED_PRECONDITION a piece whose shape disagrees with `shape` (both with
// `where`, the folder, in front). A stacked tensor is a new fp32 tensor;
// one that is not is the file's view.
absl::StatusOr<at::Tensor> ReadParam(const SafetensorsCheckpoint& checkpoint,
                                     const ModelConfig& config, const std::string& name,
                                     const std::vector<int64_t>& shape,
                                     const std::string& key_prefix, const std::string& where);

// The reverse: `value` of the ParamStore tensor `name` as the checkpoint
// tensors it is made of (views of it), under their checkpoint names.
std::vector<std::pair<std::string, at::Tensor>> CheckpointTensors(const ModelConfig& config,
                                                                  const std::string& name,
                                                                  const at::Tensor& value);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_EXPERT_LAYOUT_H_
