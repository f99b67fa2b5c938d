// Recovery: the states a run can go back to, and when it keeps them. It
// resumes a run from its checkpoint, saves checkpoints on the spec's cadence,
// keeps the guard's snapshots (guard/snapshot_ring.h), marks snapshots and
// checkpoints good once enough clean steps have followed them, and rolls the
// trained state back to the newest good one.
//
// Every rank makes the same calls at the same steps: each keeps its own
// snapshots, and saving and loading a sharded state are collective. Rank 0
// alone changes the job's checkpoint folders (rollback, good marks,
// rotation). Recovery reports nothing itself: it returns what happened, and
// the trainer reports it.
//
// Thread-compatible: the training thread drives it.
#ifndef BALLAST_WORKER_TRAIN_RECOVERY_RECOVERY_H_
#define BALLAST_WORKER_TRAIN_RECOVERY_RECOVERY_H_

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/guard/snapshot_ring.h"
#include "worker/train/model/routing_bias.h"
#include "worker/train/optim/adamw.h"
#include "worker/train/recovery/trained_state.h"

namespace ballast::train {

struct RecoveryOptions {
  // Where this run writes its checkpoints (out_dir/checkpoints).
  std::string checkpoints_dir;
  // Where they live once saved, which rollbacks read and good marks and
  // rotation change (TrainerOptions::kept_checkpoints_dir); empty:
  // checkpoints_dir.
  std::string kept_checkpoints_dir;
  // TrainerOptions::resume_at_or_before.
  std::optional<int64_t> resume_at_or_before;
  // Where the trained state lives; snapshots are copied to the host.
  c10::Device device = c10::kCPU;
};

class Recovery {
 public:
  // Where a run starts: the position, and the checkpoint folder it was
  // loaded from (empty: the initial weights, at step 0).
  struct Start {
    TrainPosition position;
    std::string checkpoint;
  };

  // `spec`, `state`, `optimizer`, `collectives` and `routing_bias` are not
  // owned and must outlive the Recovery. `routing_bias` (moe.balance
  // aux_free; null without) is state no gradient trains that checkpoints and
  // snapshots hold and resume and rollback put back with the weights.
  Recovery(const v1::JobSpec& spec, RecoveryOptions options, TrainedState* state, AdamW* optimizer,
           Collectives* collectives, RoutingBias* routing_bias = nullptr);

  // Creates the checkpoints folder, picks the checkpoint to resume from
  // (rank 0 first applies a rollback's resume_at_or_before to the folder;
  // the others look once it has), loads it, and takes the first snapshot of
  // the good state the run starts from. INTERNAL when the folder cannot be
  // made, DATA_LOSS when the checkpoint is corrupt.
  absl::StatusOr<Start> Resume();

  // Whether a checkpoint is due after the step that reached `position`:
  // every checkpoint_every steps, but not at max_steps, where the run saves
  // its last one (SaveCheckpoint with last set).
  bool CheckpointDue(const TrainPosition& position) const;
  // Writes checkpoint `position.step` and returns its folder. Unverified
  // until guard.good_after_steps clean steps have followed it, unless it is
  // the `last` of the run (nothing follows to judge it by). FAILED_PRECONDITION
  // when the state is not finite: nothing was written, and the newest good
  // checkpoint stays the one to go back to. INTERNAL when a write fails.
  absl::StatusOr<std::string> SaveCheckpoint(const TrainPosition& position, bool last);
  // Deletes the checkpoints past spec.keep_checkpoints (rank 0; keep 0
  // keeps all), but never the one of step `best_step` (the best
  // evaluation's; -1: none), nor a best evaluation's that a snapshot or a
  // kept checkpoint names: a rollback to either puts that best back as the
  // one to export. INTERNAL names a folder that could not be removed.
  absl::Status RotateCheckpoints(int64_t best_step);
  // Where checkpoint `step` lives once saved (its kept folder).
  std::string KeptCheckpoint(int64_t step) const;
  // Puts back the trained state of the kept checkpoint of `step` (the best
  // evaluation's, for the export), collectively as Resume's load.
  // DATA_LOSS when it does not load.
  absl::Status Restore(int64_t step);

  // After a step the guard applied, which ends `clean_steps` applied steps
  // in a row: marks the snapshots and checkpoints that have become good,
  // and takes a snapshot every guard.snapshot_every steps. INTERNAL when a
  // good mark cannot be written.
  absl::Status AfterAppliedStep(const TrainPosition& position, int64_t clean_steps);

  // Whether a good snapshot or checkpoint from before `step` exists.
  bool HasGoodStateBefore(int64_t step) const;

  // Puts back the newest good state from before step `before_step`: a
  // snapshot in memory, or a checkpoint when that is newer. Sets `position`
  // to its position (the data cursor included; the caller decides what data
  // to skip), forgets the snapshots and unverified checkpoints after it, and
  // (rank 0) deletes the newer checkpoint folders. Returns where it came from
  // ("snapshot", or the checkpoint folder), nullopt when there is none (and
  // nothing changed). DATA_LOSS when the state does not load.
  absl::StatusOr<std::optional<std::string>> RollBack(int64_t before_step, TrainPosition* position);

 private:
  // The routing bias's tensors (none without one), and putting them back
  // from a checkpoint folder.
  std::map<std::string, at::Tensor> Buffers() const;
  absl::Status LoadBuffers(const std::string& checkpoint);

  const v1::JobSpec& spec_;
  const RecoveryOptions options_;
  TrainedState* const state_;
  AdamW* const optimizer_;
  Collectives* const collectives_;
  RoutingBias* const routing_bias_;
  SnapshotRing snapshots_;
  // Checkpoints saved unverified that may still become good, by step.
  std::vector<int64_t> unverified_checkpoints_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RECOVERY_RECOVERY_H_
