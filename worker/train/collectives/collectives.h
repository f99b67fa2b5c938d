// Collectives: the reductions a training step needs across the ranks of a
// job. The step calls them in the same order on every rank:
//   the step's token counts      (before the first backward, for the loss scale)
//   the loss sum and the gradient's per-tensor sums of squares (for grad_norm)
//   the guard's action           (the most severe verdict wins)
// One rank needs none of them: SingleRank returns its inputs. ZeRO-3 fills in
// a c10d implementation (Gloo on CPU, NCCL on GPU) behind the same calls.
//
// Not thread-safe: the training thread calls it; every rank must make the same
// calls in the same order, or a multi-rank implementation waits for the
// missing one until its timeout.
#ifndef BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
#define BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace ballast::train {

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Replaces `values` (any dtype, on the step's device) by its element-wise
  // sum over all ranks.
  virtual void SumInPlace(at::Tensor& values) = 0;
  // The largest of every rank's `value`.
  virtual int64_t Max(int64_t value) = 0;
};

// A job of one rank: every reduction is the identity.
class SingleRank : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void SumInPlace(at::Tensor&) override {}
  int64_t Max(int64_t value) override { return value; }
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
