// Expert parallelism's exchange (moe.expert_parallel): the rows a sparse
// layer routed travel to the ranks that hold their experts, and the experts'
// outputs travel back.
//
// With N ranks and E experts, rank q holds experts [q E/N, (q + 1) E/N), the
// shards of a ShardedModel's experts buckets (worker/train/shard/). Each
// rank's rows are in expert order (kernels/expert_order.h), so the rows for
// rank q's experts are one contiguous run. Per sparse layer and forward:
//   counts (N, E)  every rank's rows per expert: one allreduce of N E int64
//   Dispatch       each run to its rank (an all-to-all), then on the
//                  receiving rank sorted by its expert and, within one,
//                  by source rank: the grouped GEMMs' segments
//                  (local_offsets())
//   Combine        the reverse: unsorted, then the reverse all-to-all
// Autograd: each all-to-all's gradient is the reverse all-to-all of its
// output's gradient, so the backward makes the same exchanges in reverse
// order on every rank; the permutations' gradients are gathers. A rank that
// sends or receives no row still takes part.
//
// An expert's rows thus meet on one rank, and its gradient there is the sum
// over every rank's tokens: what ZeRO-3's reduce-scatter would have summed,
// in another order of the same terms.
#ifndef BALLAST_WORKER_TRAIN_MODEL_EXPERT_EXCHANGE_H_
#define BALLAST_WORKER_TRAIN_MODEL_EXPERT_EXCHANGE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "worker/train/collectives/collectives.h"

namespace ballast::train {

class ExpertExchange {
 public:
  // `counts` (E,) int64: this rank's rows per expert (ExpertOrder::counts).
  // `group` (not owned) must divide E by its world size. Every rank of
  // `group` calls it, with the same E.
  ExpertExchange(Collectives* group, const at::Tensor& counts);

  // rows (R, ...) in expert order -> the rows every rank routed to this
  // rank's experts, sorted by expert: differentiable.
  at::Tensor Dispatch(const at::Tensor& rows) const;
  // The reverse of Dispatch: this rank's experts' output rows, in Dispatch's
  // order, back to their ranks, in `rows`' order there.
  at::Tensor Combine(const at::Tensor& local) const;
  // (E / N,) int32 cumulative row ends of this rank's experts' segments in
  // Dispatch's output, on the counts' device.
  const at::Tensor& local_offsets() const { return local_offsets_; }

 private:
  Collectives* group_;
  std::vector<int64_t> send_rows_;  // to each rank
  std::vector<int64_t> recv_rows_;  // from each rank
  at::Tensor sorted_;               // received row at each sorted position
  at::Tensor unsorted_;             // sorted position of each received row
  at::Tensor local_offsets_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_EXPERT_EXCHANGE_H_
