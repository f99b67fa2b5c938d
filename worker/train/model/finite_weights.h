// Finite weights: a base model that holds a NaN or an infinity trains
// nothing (every step's loss or gradient is then non-finite, and the guard
// skips it), so the trainer refuses one at load, before step 1, naming the
// tensor and the element.
//
// The check is one pass over the weights, a min and a max per tensor (NaN
// and the infinities pass through both); only a tensor that fails it is
// read again, to find the element. The ranks of a job share it: each checks
// every world_size-th tensor in the file's own dtype (a sharded rank's
// tensors are still views of the mapped file then), and a sum over the
// ranks of what each found is the whole model's check, the same on every
// rank.
#ifndef BALLAST_WORKER_TRAIN_MODEL_FINITE_WEIGHTS_H_
#define BALLAST_WORKER_TRAIN_MODEL_FINITE_WEIGHTS_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "absl/status/status.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

// For each tensor of `weights` (ParamStore order), the flat index of its
// first non-finite element plus 1, or 0 when it is finite or another rank's
// to check (every `world_size`-th tensor from `rank` is this one's): an
// int64 tensor of one entry per tensor, on the CPU.
at::Tensor FirstNonFiniteElements(const ParamStore& weights, int rank, int world_size);

// INVALID_ARGUMENT naming the first tensor of `weights` whose entry of
// `first` (FirstNonFiniteElements summed over the ranks) is set, the value
// and the flat index and position of its first non-finite element, and
// `model_dir`; OK when no entry is set.
absl::Status RefuseNonFiniteWeights(const ParamStore& weights, const at::Tensor& first,
                                    const std::string& model_dir);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_FINITE_WEIGHTS_H_
