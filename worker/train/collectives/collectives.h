// Collectives: the communication a training step needs across the ranks of a
// job. Every rank makes the same calls in the same order:
//   the step's token counts      (before the first backward, for the loss scale)
//   per unit, forward then backward: AllGather of its shards, and in backward
//     ReduceScatter of its gradients (ZeRO-3, worker/train/shard/)
//   the loss sum and the gradient's sums of squares (for grad_norm)
//   the guard's action           (the most severe verdict wins)
// One rank needs no communication: SingleRank copies. ProcessGroupCollectives
// (process_group.h) runs them over c10d: Gloo on CPU, NCCL on GPU.
//
// Not thread-safe: the training thread calls it; a rank that skips a call
// leaves its peers waiting until the group's timeout.
#ifndef BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
#define BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace ballast::train {

// A collective that was issued and may still be moving data; its output is
// valid once Wait() returns. Wait() throws (c10::Error) when a peer is lost.
class InFlight {
 public:
  virtual ~InFlight() = default;
  virtual void Wait() = 0;
};

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

  // full (world_size * n) = every rank's shard (n) in rank order. Contiguous
  // 1-D tensors of one dtype; `full` must stay alive until Wait().
  virtual std::unique_ptr<InFlight> AllGather(at::Tensor full, at::Tensor shard) = 0;
  // shard (n) = the sum over ranks of their full[rank * n, (rank + 1) * n).
  // Contiguous 1-D tensors: `shard` fp32, `full` fp32 or bf16 (what is
  // sent); the sum is in fp32 either way (Gloo and NCCL would add bf16 in
  // bf16).
  virtual std::unique_ptr<InFlight> ReduceScatter(at::Tensor shard, at::Tensor full) = 0;
  // Returns when every rank has called it.
  virtual void Barrier() = 0;

  // Bytes this rank has sent plus received, by the algorithm's own count
  // (see process_group.cc), since it was made.
  virtual int64_t communicated_bytes() const = 0;

  // Called before each write that outlives the attempt (a commit, a report):
  // ends the process when this rank has been silent for longer than its
  // peers wait for it (process_group.h), so that a rank that was stopped
  // never writes after they gave up on it. One rank is never silent.
  virtual void FenceIfStalled() {}
};

// A job of one rank: reductions are the identity, a gather is a copy.
class SingleRank : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void SumInPlace(at::Tensor&) override {}
  int64_t Max(int64_t value) override { return value; }
  std::unique_ptr<InFlight> AllGather(at::Tensor full, at::Tensor shard) override;
  std::unique_ptr<InFlight> ReduceScatter(at::Tensor shard, at::Tensor full) override;
  void Barrier() override {}
  int64_t communicated_bytes() const override { return 0; }
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
