// SnapshotRing: the last few states of a run, in host memory, for the
// guard's rollbacks. A snapshot is what a checkpoint holds (the trainable
// tensors, or this rank's shards of them; the optimizer; the generators; the
// buffers; the position), taken every guard.snapshot_every steps without touching the
// disk, so that a rollback goes back a few steps, not to the last
// checkpoint, and costs a copy, not a load.
//
// A snapshot is good, and only then one to go back to, once good_after
// applied steps in a row have followed it (the state looked healthy for a
// while after it was taken). Every rank of a job takes and restores its own
// snapshots at the same steps.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_GUARD_SNAPSHOT_RING_H_
#define BALLAST_WORKER_TRAIN_GUARD_SNAPSHOT_RING_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/model/param_store.h"
#include "worker/train/optim/adamw.h"

namespace ballast::train {

struct TrainSnapshot {
  TrainPosition position;
  std::map<std::string, at::Tensor> trained;    // the trainable tensors, on the host
  std::map<std::string, at::Tensor> optimizer;  // AdamW::StateDict, on the host
  std::map<std::string, at::Tensor> generators;
  // Model tensors no gradient trains (checkpoint.h), on the host; the
  // caller, who owns them, puts them back.
  std::map<std::string, at::Tensor> buffers;
  bool good = false;
};

class SnapshotRing {
 public:
  // `capacity` snapshots at most; the oldest goes first.
  explicit SnapshotRing(int64_t capacity) : capacity_(capacity) {}

  // Copies the state after step `position.step` to the host; `buffers`
  // are host copies already.
  void Take(const TrainPosition& position, const ParamStore& trained, const AdamW& optimizer,
            c10::Device device, std::map<std::string, at::Tensor> buffers = {});

  // After step `step`, which ends `clean_steps` applied steps in a row:
  // every snapshot with at least `good_after` of them after it is good.
  void MarkGood(int64_t step, int64_t clean_steps, int64_t good_after);

  // The newest good snapshot from before step `before_step` (its
  // position.step < before_step), or null.
  const TrainSnapshot* NewestGoodBefore(int64_t before_step) const;

  // Puts a snapshot's state back, in place (the tensors keep their storage).
  // DATA_LOSS when the optimizer state does not fit the optimizer.
  static absl::Status Restore(const TrainSnapshot& snapshot, ParamStore* trained, AdamW* optimizer,
                              c10::Device device);

  // Drops the snapshots taken after step `step` (they belong to the
  // trajectory a rollback abandoned).
  void DropAfter(int64_t step);

  // The best evaluations' steps that the snapshots' positions name (none
  // for -1): the checkpoints a rollback to one of them may export.
  std::vector<int64_t> BestEvaluationSteps() const;

  int64_t size() const { return static_cast<int64_t>(ring_.size()); }

 private:
  const int64_t capacity_;
  std::deque<TrainSnapshot> ring_;  // oldest first
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_GUARD_SNAPSHOT_RING_H_
