// ParamStore: the single owner of every tensor a model is made of.
//
// Tensors are keyed by their HF checkpoint names ("model.layers.3.mlp.up_proj.weight";
// LoRA tensors as "model.layers.3.mlp.up_proj.lora_A.weight") and grouped by
// decoder layer, so that a sharded trainer can flatten one layer's tensors
// into one bucket without touching the model code: the model reads tensors
// from here by name on every forward, and never keeps its own copies.
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_MODEL_PARAM_STORE_H_
#define BALLAST_WORKER_TRAIN_MODEL_PARAM_STORE_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ballast::train {

class ParamStore {
 public:
  // Group of tensors outside any decoder layer (embeddings, final norm, lm_head).
  static constexpr int64_t kNoLayer = -1;

  // Adds a tensor. `layer` is its decoder layer, or kNoLayer. Trainable
  // tensors get requires_grad. Names are unique (throws c10::Error otherwise).
  void Add(const std::string& name, at::Tensor value, int64_t layer, bool trainable);

  // Adds a tensor of `shape`, in the pieces' dtype, whose elements flattened
  // are the `pieces`' elements one after another (each a whole tensor, such
  // as a mapped checkpoint tensor), without copying them into one: a rank of
  // a sharded model copies only its ranges (CopyFlatRange), so the experts a
  // checkpoint stores one by one are never stacked whole on any rank. Its
  // get() is a meta tensor (shape and dtype, no elements), and MoveTo
  // refuses it.
  void AddPieces(const std::string& name, const std::vector<int64_t>& shape,
                 std::vector<at::Tensor> pieces, int64_t layer, bool trainable);
  // Copies elements [begin, begin + out.numel()) of `name` flattened into
  // `out` (a 1-D view of the destination), from its pieces when it has them.
  void CopyFlatRange(const std::string& name, int64_t begin, at::Tensor out) const;

  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  // The tensor under `name`; throws c10::Error naming it when absent.
  const at::Tensor& get(const std::string& name) const;
  // Replaces the value under `name` in place (same shape and dtype), keeping
  // requires_grad; used by checkpoint restore and the optimizer.
  void Assign(const std::string& name, const at::Tensor& value);
  // Makes `name` refer to `value` itself, with no copy and no change to its
  // requires_grad: the sharded model (worker/train/shard/) swaps in views of
  // a unit's gathered buffer each time it gathers the unit.
  void Rebind(const std::string& name, at::Tensor value);
  // Moves every tensor to `device`, frozen ones in `frozen_dtype`: the
  // decoder casts each weight to the compute dtype on use, so a frozen
  // weight kept in it computes the same and is half the bytes in bf16.
  // Trainable tensors stay fp32 masters. Each moved tensor is a new leaf.
  void MoveTo(c10::Device device, at::ScalarType frozen_dtype);
  // The device of the tensors; the CPU for an empty store.
  c10::Device device() const;

  // Names in insertion order (HF order: embeddings, layers 0..n-1, norm, head).
  const std::vector<std::string>& names() const { return names_; }
  // Names of trainable tensors, in insertion order.
  std::vector<std::string> TrainableNames() const;
  // Names of one decoder layer (or kNoLayer), in insertion order.
  std::vector<std::string> LayerNames(int64_t layer) const;
  bool trainable(const std::string& name) const;
  // Marks an existing tensor trainable (LoRA's modules_to_save).
  void SetTrainable(const std::string& name);
  int64_t num_layers() const { return num_layers_; }
  // Elements over all tensors, and over trainable ones.
  int64_t Numel() const;
  int64_t TrainableNumel() const;

 private:
  struct Entry {
    at::Tensor value;
    int64_t layer;
    bool trainable;
    std::vector<at::Tensor> pieces;  // AddPieces' elements, in flat order
  };
  std::vector<std::string> names_;
  std::map<std::string, Entry> index_;
  int64_t num_layers_ = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_PARAM_STORE_H_
