// ShardedModel: ZeRO-3 over the ranks of a job (PyTorch FSDP2 with
// reshard_after_forward=True is the closest peer). Each rank holds 1/N of
// every bucket of FlatLayout: frozen shards in the compute dtype, trainable
// ones as fp32 masters with fp32 gradient shards, and AdamW (the trainer's)
// keeps moments for the trainable shards only.
//
// With hybrid sharding (HSDP, collectives.h) N is the shard group's size G
// and rank r of a shard group holds the same 1/G in every replica: gathers
// and reduce-scatters stay inside the shard group, and once per step
// ReduceAcrossReplicas() sums the gradient shards over the replica group, so
// that every replica's AdamW steps on the same whole-step gradient.
//
// A step, per micro-batch:
//   GatherRoots()          all-gathers the embeddings, final norm and lm_head;
//                          they stay gathered until the micro-batch's backward
//                          is done (the loss reads lm_head in backward too).
//   forward, per layer     RunLayer(): waits for the layer's gather, issues the
//                          next `prefetch` layers', runs the layer, frees it.
//   backward, per layer    gathers the layer again (issuing the previous
//                          `prefetch` layers'), backpropagates through it,
//                          issues the reduce-scatter of its gradient into the
//                          gradient shards (summed in fp32; sent in
//                          reduce_dtype), and frees it. The reduce-scatters
//                          run behind the backward, `prefetch` layers at most.
//   FinishBackward()       reduce-scatters the roots' gradients, waits for
//                          every reduction, frees the roots.
// and after the step's last micro-batch, ReduceAcrossReplicas() (hybrid).
// Without activation checkpointing a layer's autograd graph is kept from
// forward to backward and the layer is gathered back into the same storage
// (its saved tensors are views of it); with it, the layer is recomputed in
// backward under the forward's RNG state. Either way at most 1 + prefetch
// layers are gathered at once, each in a slab of memory allocated once (the
// roots have one more), so the per-layer gathers never churn the heap.
//
// Under expert parallelism (Zero3Options) a layer's gather leaves out its
// experts: the unit's slab holds this rank's E / N experts, copied from their
// shards, and the rows routed to them come over an all-to-all instead. Where
// tokens are fewer than expert weights (always, for a model with many
// experts), the all-to-all moves fewer bytes than the gathers and
// reduce-scatters it replaces.
//
// Deeper prefetch hides more latency (a slow link, a layer faster than its
// gather) for a layer's parameters of memory per unit, plus its gradient
// twice over (fp32 and the received chunks) per reduction in flight; it
// changes no bit of the result: every sum is made in the same order.
//
// Not thread-safe; every rank must make the same calls in the same order.
#ifndef BALLAST_WORKER_TRAIN_SHARD_SHARDED_MODEL_H_
#define BALLAST_WORKER_TRAIN_SHARD_SHARDED_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/train/collectives/collectives.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/param_store.h"
#include "worker/train/shard/flat_layout.h"

namespace ballast::train {

// How far communication runs ahead of compute (JobSpec.zero3).
struct Zero3Options {
  // Layer units whose all-gather may be in flight ahead of the one
  // computing; also the units whose reduce-scatters may be in flight behind
  // the backward. At least 1.
  int prefetch = 1;
  // What gradients are sent in for reduce-scatter: fp32, or bf16 (half the
  // bytes, rounded once); the shards are summed in fp32 either way.
  at::ScalarType reduce_dtype = at::kFloat;
  // Expert parallelism (moe.expert_parallel): each stacked experts tensor's
  // shard (whole experts, flat_layout.h) is computed on where it lies, never
  // gathered, and the routed rows travel to it instead (sparse_moe.h, over
  // expert_group()); its gradient, complete on its rank, goes to its
  // gradient shard without a reduce-scatter. The world size must divide
  // the number of experts.
  bool expert_parallel = false;
};

class ShardedModel : public LayerRunner {
 public:
  // Keeps this rank's elements of every tensor in `full` (on any device) and
  // drops the rest, sharding over collectives->shard_group(). Shards,
  // gathered units and gradients live on `device`, which must be the
  // collectives' own. `collectives` must outlive the model.
  ShardedModel(ParamStore full, Collectives* collectives, at::ScalarType compute_dtype,
               c10::Device device, Zero3Options options = {});
  ~ShardedModel() override;

  const FlatLayout& layout() const { return layout_; }
  // The ranks the experts are split over (the shard group) under expert
  // parallelism, in whose order rank r holds experts [r E / N, (r + 1) E / N);
  // else null.
  Collectives* expert_group() const { return options_.expert_parallel ? collectives_ : nullptr; }
  c10::Device device() const { return device_; }
  // What the decoder reads: every tensor of the model, by name. A tensor
  // holds data only while its unit is gathered.
  const ParamStore& gathered() const { return gathered_; }
  // The trainable shards (fp32), one per trainable bucket, named by its key;
  // .grad() is the gradient shard, undefined until a backward reaches it.
  ParamStore& masters() { return masters_; }
  const ParamStore& masters() const { return masters_; }

  void GatherRoots();
  void FinishBackward();
  // Hybrid sharding: replaces every gradient shard by its sum over the
  // replica group, in one fp32 allreduce of them all (a shard without a
  // gradient, which then has none on any rank, stays so). Once per step,
  // after the last micro-batch's FinishBackward; nothing without replicas.
  void ReduceAcrossReplicas();
  // Whether this rank's gradient shards count in the step's gradient norm
  // summed over the world: false on every replica but the first, which hold
  // the same shards once ReduceAcrossReplicas() has run.
  bool counts_in_grad_norm() const;
  // Frees the roots after a forward without backward (an evaluation).
  void ReleaseRoots();

  at::Tensor RunLayer(const Decoder& decoder, int64_t layer, const at::Tensor& h,
                      const at::Tensor& cos, const at::Tensor& sin,
                      const kernels::AttentionMask& mask, bool training) override;
  void WithLayer(int64_t layer, int64_t last, const std::function<void()>& forwards) override;

  // Every tensor (trainable_only: every trainable tensor) in fp32 with its
  // full shape, on every rank. Gathers one bucket at a time; every rank
  // must call it.
  std::vector<std::pair<std::string, at::Tensor>> GatherFullTensors(bool trainable_only);

  // The trainable tensors' names in layout order, and this rank's part of
  // each one's gradient sum of squares (fp64, on the device; 0 for a tensor
  // this rank holds none of, or times 0 where !counts_in_grad_norm(), which
  // keeps a NaN): summed over the world, each tensor's squared gradient norm. The guard's view of
  // where a bad step went wrong; it costs a pass over the gradient shards.
  std::pair<std::vector<std::string>, at::Tensor> GradSumSquaresByTensor() const;

  // This rank's resident bytes: frozen shards plus fp32 masters, and the
  // gradient shards (the size of the masters).
  int64_t parameter_bytes() const;
  int64_t gradient_bytes() const;
  // The slabs the gathered units live in: 1 + prefetch of the largest layer
  // and one for the roots, in the compute dtype. Allocated once.
  int64_t gathered_buffer_bytes() const;

  // Internal, for the layer's autograd function (sharded_model.cc).
  struct Bucket;
  struct Unit;
  void WaitGathered(size_t unit);
  // Issues the gathers of the `prefetch` layer units after `unit` in the
  // direction `step` (+1 in forward, -1 in backward), none past layer unit
  // `bound` in that direction.
  void PrefetchFrom(size_t unit, int step, std::optional<size_t> bound = std::nullopt);
  void Release(size_t unit);
  // Reduce-scatters each trainable bucket's flat gradient (same order as
  // TrainableFlats; undefined: none) into its gradient shard.
  void ReduceGradients(size_t unit, const std::vector<at::Tensor>& flat_grads);
  // The unit's trainable flat buffers (leaves that require grad).
  std::vector<at::Tensor> TrainableFlats(size_t unit) const;
  size_t LayerUnit(int64_t layer) const;
  size_t num_units() const;
  bool IsLayer(size_t unit) const;

 private:
  void Gather(size_t unit);
  // Waits for the oldest unit's reductions and adds them to the gradient
  // shards.
  void FinishOldestReductions();

  Collectives* collectives_;  // the shard group
  Collectives* replicas_;     // hybrid sharding's replica group, or null
  at::ScalarType compute_dtype_;
  Zero3Options options_;
  c10::Device device_;
  FlatLayout layout_;
  ParamStore gathered_;
  ParamStore masters_;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // as layout_.buckets
  std::vector<Unit> units_;
  std::vector<size_t> layer_units_;  // layer -> unit
  std::vector<size_t> root_units_;
  // Memory the gathered units live in: [0] the roots', [1..1 + prefetch]
  // one layer's each (see the constructor).
  std::vector<at::Tensor> slabs_;
  std::vector<bool> slab_taken_;
  struct PendingReduction;
  // Reductions in flight, a unit's a row, oldest first.
  std::deque<std::vector<PendingReduction>> pending_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_SHARD_SHARDED_MODEL_H_
