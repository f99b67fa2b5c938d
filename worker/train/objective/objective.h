// Objective: what a job trains the model to do, as a loss on the decoder's
// hidden states. The job spec's `task` picks one; the trainer calls it once
// per micro-batch and never knows which it is.
//
// Every objective returns (sum, count), never a mean: the trainer divides the
// sum of every micro-batch by the count of the whole optimizer step, over all
// micro-batches and ranks (shared/DESIGN.md, numerics contract 2).
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "kernels/loss.h"
#include "worker/train/data/packed_batch.h"
#include "worker/train/model/decoder.h"

namespace ballast::train {

class Objective {
 public:
  virtual ~Objective() = default;

  // The loss of `batch` under `decoder`: sum differentiable in the trainable
  // tensors, count the number of targets it is normalised by. `training`
  // turns dropout on. Throws c10::Error (from LibTorch) on a malformed batch.
  virtual kernels::LossSum Loss(const Decoder& decoder, const PackedBatch& batch,
                                bool training) const = 0;
};

// The objective of spec.task(). INVALID_ARGUMENT names a task this build
// does not train.
absl::StatusOr<std::unique_ptr<Objective>> MakeObjective(const v1::JobSpec& spec);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_OBJECTIVE_H_
