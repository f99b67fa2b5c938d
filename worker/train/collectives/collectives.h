// Collectives: the communication a training step needs across the ranks of a
// job. Every rank makes the same calls in the same order:
//   the step's token counts      (before the first backward, for the loss scale)
//   per unit, forward then backward: AllGather of its shards, and in backward
//     ReduceScatter of its gradients (ZeRO-3, worker/train/shard/)
//   the loss sum and the gradient's sums of squares (for grad_norm)
//   the guard's action           (the most severe verdict wins)
//   per sparse layer, with expert parallelism: AllToAll of the routed rows
//     to their experts' ranks and back, in forward and again in backward
// One rank needs no communication: SingleRank copies. ProcessGroupCollectives
// (process_group.h) runs them over c10d: Gloo on CPU, NCCL on GPU.
//
// Hybrid sharding (sharding.strategy hybrid, HSDP): the world's ranks form a
// 2-D mesh, M replicas x G ranks per shard group, rank = replica * G +
// shard rank. A ZeRO-3 model gathers and reduce-scatters in its shard_group()
// (the G ranks of one replica, normally one worker's GPUs) and sums its
// gradient shards once per step in its replica_group() (the M ranks that hold
// the same shard, one per replica). Everything else (token counts, the loss,
// grad_norm, the guard) stays on the world, as without it.
//
// Not thread-safe: the training thread calls it; a rank that skips a call
// leaves its peers waiting until the group's timeout.
#ifndef BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
#define BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

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
  // Rows from every rank to every rank (expert parallelism, sparse_moe.h):
  // this rank sends rank q `send_rows[q]` rows of `input`, in rank order,
  // and receives rank p's `recv_rows[p]` rows into `output`, in rank order.
  // Contiguous tensors of one dtype on the step's device, rows along dim 0,
  // any row count zero; returns when `output` holds them.
  virtual void AllToAll(at::Tensor output, at::Tensor input, const std::vector<int64_t>& recv_rows,
                        const std::vector<int64_t>& send_rows) = 0;
  // Returns when every rank has called it.
  virtual void Barrier() = 0;

  // Bytes this rank has sent plus received, by the algorithm's own count
  // (see process_group.cc), since it was made: the world's and, with hybrid
  // sharding, its shard and replica groups' too.
  virtual int64_t communicated_bytes() const = 0;
  // Of communicated_bytes, those of replica_group(); 0 without one.
  virtual int64_t replica_communicated_bytes() const { return 0; }

  // The group a ZeRO-3 model shards over: this one, or with hybrid sharding
  // this rank's shard group (owned by this; its rank() is the rank in the
  // group). Its collectives count in this one's communicated_bytes.
  virtual Collectives& shard_group() { return *this; }
  // With hybrid sharding, the ranks holding this rank's shard in every
  // replica (owned by this; rank() is the replica's number); else null.
  virtual Collectives* replica_group() { return nullptr; }

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
  void AllToAll(at::Tensor output, at::Tensor input, const std::vector<int64_t>& recv_rows,
                const std::vector<int64_t>& send_rows) override;
  void Barrier() override {}
  int64_t communicated_bytes() const override { return 0; }
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_COLLECTIVES_COLLECTIVES_H_
