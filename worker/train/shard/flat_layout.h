// FlatLayout: how a model's tensors are laid out in flat buckets for ZeRO-3.
//
// The unit of gathering is one decoder layer; the embeddings, the final norm
// and lm_head are units of their own. Each unit's tensors go into at most two
// buckets, frozen and trainable (every master is fp32, so the class is also
// the dtype class), each padded with zeros to a multiple of the world size so
// that rank r holds elements [r * S, (r + 1) * S) with S = padded / N.
//
// A tensor's offset in its bucket does not depend on the world size (only
// the padding at the end does), so a flat position names the same element
// at any N: a checkpoint saved at one N reshards at another by intersecting
// ranges.
//
// A mixture-of-experts layer's stacked experts tensors (expert_layout.h:
// experts.gate_up_proj, experts.down_proj and their adapters, each (E, ...))
// each have a bucket of their own in the unit, after its other buckets of the
// same class. When the world size divides E, rank r's shard of such a bucket
// is then whole experts, E / N of them from r * E / N, which expert
// parallelism (sharded_model.h) computes on without gathering; at every
// world size, with it or without, the buckets and their checkpoints are the
// same.
//
// Order inside a bucket: the ParamStore's (HF's: q, k, v, then their biases,
// ..., gate, up, down), LoRA's A matrices before its B matrices. Tensors a
// layer multiplies side by side (q/k/v, gate/up and their A's) are thus
// adjacent, and the decoder joins them as a view, never a copy.
#ifndef BALLAST_WORKER_TRAIN_SHARD_FLAT_LAYOUT_H_
#define BALLAST_WORKER_TRAIN_SHARD_FLAT_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

struct FlatEntry {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements, from the bucket's start
  int64_t numel = 0;
};

struct FlatBucket {
  std::string unit;  // "model.embed_tokens", "model.layers.3", "model.norm", "lm_head"
  int64_t layer = ParamStore::kNoLayer;
  bool trainable = false;
  // The stacked experts tensor that is the bucket's one entry (see above);
  // empty for the unit's other tensors.
  std::string experts_tensor;
  std::vector<FlatEntry> entries;
  int64_t numel = 0;   // sum of the entries
  int64_t padded = 0;  // numel rounded up to a multiple of the world size

  // "model.layers.3/trainable" ("model.layers.3.mlp.experts.down_proj/frozen"
  // for an experts tensor's): the bucket's name in checkpoints.
  std::string key() const {
    return (experts_tensor.empty() ? unit : experts_tensor) +
           (trainable ? "/trainable" : "/frozen");
  }
  bool experts() const { return !experts_tensor.empty(); }
  int64_t shard_numel(int world_size) const { return padded / world_size; }
};

struct FlatLayout {
  int world_size = 1;
  // In forward order: embeddings, layers 0..n-1, final norm, lm_head.
  std::vector<FlatBucket> buckets;

  static FlatLayout Plan(const ParamStore& params, int world_size);
  // The same buckets, padded for another world size.
  FlatLayout Repadded(int new_world_size) const;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_SHARD_FLAT_LAYOUT_H_
