#include "worker/train/recovery/recovery.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"

namespace ballast::train {

Recovery::Recovery(const v1::JobSpec& spec, RecoveryOptions options, TrainedState* state,
                   AdamW* optimizer, Collectives* collectives, RoutingBias* routing_bias)
    : spec_(spec),
      options_([&] {
        if (options.kept_checkpoints_dir.empty()) {
          options.kept_checkpoints_dir = options.checkpoints_dir;
        }
        return std::move(options);
      }()),
      state_(state),
      optimizer_(optimizer),
      collectives_(collectives),
      routing_bias_(routing_bias),
      snapshots_(spec.guard().snapshots()) {}

absl::StatusOr<Recovery::Start> Recovery::Resume() {
  std::error_code ec;
  std::filesystem::create_directories(options_.checkpoints_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", options_.checkpoints_dir));

  // A rollback deletes the newer checkpoints, so that a later restart cannot
  // jump forward again. Rank 0 alone applies it to the shared checkpoints
  // folder; the others look once it has.
  const auto pick = [&]() -> absl::StatusOr<std::optional<std::string>> {
    if (options_.resume_at_or_before) {
      return KeepCheckpointsAtOrBefore(options_.checkpoints_dir, *options_.resume_at_or_before);
    }
    return LatestCheckpoint(options_.checkpoints_dir);
  };
  absl::StatusOr<std::optional<std::string>> resume_from;
  if (collectives_->rank() == 0) resume_from = pick();
  collectives_->Barrier();
  if (collectives_->rank() != 0) resume_from = pick();
  if (!resume_from.ok()) return resume_from.status();
  Start start;
  if (*resume_from) {
    absl::StatusOr<TrainPosition> loaded = state_->Load(**resume_from, optimizer_);
    if (!loaded.ok()) return loaded.status();
    if (absl::Status s = LoadBuffers(**resume_from); !s.ok()) return s;
    start.position = *loaded;
    start.checkpoint = **resume_from;
  }
  // The state the run starts from is good (the initial weights, or a good
  // checkpoint): the first snapshot to go back to.
  snapshots_.Take(start.position, state_->trained(), *optimizer_, options_.device, Buffers());
  snapshots_.MarkGood(start.position.step, 0, 0);
  return start;
}

bool Recovery::CheckpointDue(const TrainPosition& position) const {
  const int64_t every = spec_.checkpoint_every();
  return every > 0 && position.step % every == 0 && position.step < spec_.max_steps();
}

absl::StatusOr<std::string> Recovery::SaveCheckpoint(const TrainPosition& position, bool last) {
  // Good once guard.good_after_steps clean steps have followed it; the last
  // one holds the state the export holds.
  const CheckpointHealth health = !last && spec_.guard().good_after_steps() > 0
                                      ? CheckpointHealth::kUnverified
                                      : CheckpointHealth::kGood;
  absl::StatusOr<std::string> dir =
      state_->Save(options_.checkpoints_dir, position, *optimizer_, health, Buffers());
  if (dir.ok() && health == CheckpointHealth::kUnverified) {
    unverified_checkpoints_.push_back(position.step);
  }
  return dir;
}

absl::Status Recovery::RotateCheckpoints(int64_t best_step) {
  if (collectives_->rank() != 0 || spec_.keep_checkpoints() <= 0) return absl::OkStatus();
  std::vector<int64_t> best_steps = snapshots_.BestEvaluationSteps();
  if (best_step >= 0) best_steps.push_back(best_step);
  return train::RotateCheckpoints(options_.kept_checkpoints_dir, spec_.keep_checkpoints(),
                                  best_steps);
}

std::string Recovery::KeptCheckpoint(int64_t step) const {
  return CheckpointFolderFor(options_.kept_checkpoints_dir, step).final_dir;
}

absl::Status Recovery::Restore(int64_t step) {
  const std::string dir = KeptCheckpoint(step);
  absl::StatusOr<TrainPosition> loaded = state_->Load(dir, optimizer_);
  if (!loaded.ok()) return loaded.status();
  return LoadBuffers(dir);
}

absl::Status Recovery::AfterAppliedStep(const TrainPosition& position, int64_t clean_steps) {
  const int64_t good_after = spec_.guard().good_after_steps();
  snapshots_.MarkGood(position.step, clean_steps, good_after);
  for (auto it = unverified_checkpoints_.begin(); it != unverified_checkpoints_.end();) {
    const int64_t after = position.step - *it;
    if (clean_steps < after) {
      // A bad step came between: it can never be good.
      it = unverified_checkpoints_.erase(it);
    } else if (after >= good_after) {
      if (collectives_->rank() == 0) {
        absl::Status s =
            MarkCheckpointGood(CheckpointFolderFor(options_.kept_checkpoints_dir, *it).final_dir);
        if (!s.ok()) return s;
      }
      it = unverified_checkpoints_.erase(it);
    } else {
      ++it;
    }
  }
  const int64_t every = spec_.guard().snapshot_every();
  if (every > 0 && position.step % every == 0) {
    snapshots_.Take(position, state_->trained(), *optimizer_, options_.device, Buffers());
  }
  return absl::OkStatus();
}

bool Recovery::HasGoodStateBefore(int64_t step) const {
  return snapshots_.NewestGoodBefore(step) != nullptr ||
         LatestCheckpoint(options_.kept_checkpoints_dir, step - 1).has_value();
}

absl::StatusOr<std::optional<std::string>> Recovery::RollBack(int64_t before_step,
                                                              TrainPosition* position) {
  const TrainSnapshot* snapshot = snapshots_.NewestGoodBefore(before_step);
  const std::optional<std::string> checkpoint =
      LatestCheckpoint(options_.kept_checkpoints_dir, before_step - 1);
  const int64_t checkpoint_step = checkpoint ? CheckpointStepOf(*checkpoint).value_or(-1) : -1;
  std::string restored_from;
  if (snapshot != nullptr && snapshot->position.step >= checkpoint_step) {
    if (absl::Status s =
            SnapshotRing::Restore(*snapshot, &state_->trained(), optimizer_, options_.device);
        !s.ok()) {
      return s;
    }
    if (routing_bias_ != nullptr) {
      if (absl::Status s = routing_bias_->Restore(snapshot->buffers); !s.ok()) return s;
    }
    *position = snapshot->position;
    restored_from = "snapshot";
  } else if (checkpoint) {
    absl::StatusOr<TrainPosition> loaded = state_->Load(*checkpoint, optimizer_);
    if (!loaded.ok()) return loaded.status();
    if (absl::Status s = LoadBuffers(*checkpoint); !s.ok()) return s;
    *position = *loaded;
    restored_from = *checkpoint;
  } else {
    return std::optional<std::string>();
  }
  // What came after the state gone back to belongs to the abandoned run.
  snapshots_.DropAfter(position->step);
  std::erase_if(unverified_checkpoints_, [&](int64_t s) { return s > position->step; });
  if (collectives_->rank() == 0) {
    absl::StatusOr<std::optional<std::string>> kept =
        KeepCheckpointsAtOrBefore(options_.kept_checkpoints_dir, position->step);
    if (!kept.ok()) return kept.status();
  }
  return restored_from;
}

std::map<std::string, at::Tensor> Recovery::Buffers() const {
  if (routing_bias_ == nullptr) return {};
  return routing_bias_->Tensors();
}

absl::Status Recovery::LoadBuffers(const std::string& checkpoint) {
  if (routing_bias_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::map<std::string, at::Tensor>> buffers = LoadCheckpointBuffers(checkpoint);
  if (!buffers.ok()) return buffers.status();
  if (absl::Status s = routing_bias_->Restore(*buffers); !s.ok()) {
    return absl::DataLossError(absl::StrCat(checkpoint, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace ballast::train
