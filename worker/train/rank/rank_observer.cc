#include "worker/train/rank/rank_observer.h"

#include <signal.h>

#include <atomic>
#include <iostream>

namespace ballast::train {
namespace {

// Set by the signal handler: lock-free, so async-signal-safe.
std::atomic<bool> sigterm_received{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void OnSigterm(int) {
  if (sigterm_received.exchange(true)) {
    // The second one: whoever sent it wants the process gone now.
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
  }
}

}  // namespace

void RankObserver::CatchSigterm() {
  struct sigaction action {};
  action.sa_handler = OnSigterm;
  sigemptyset(&action.sa_mask);
  // Restarted, so that a read or write inside LibTorch never sees EINTR.
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
}

void RankObserver::CommitFailed(const absl::Status& status) {
  if (!commit_status_.ok()) return;
  commit_status_ = status;
  std::cerr << "ballast-train: " << status.message() << std::endl;
}

void RankObserver::OnEvent(const v1::TrainingEvent& event) {
  gang_->FenceIfStalled();
  switch (event.kind_case()) {
    case v1::TrainingEvent::kStepMetrics:
    // The end, before the export: the lines after the last step's (its
    // evaluation) are committed with the rest.
    case v1::TrainingEvent::kEnd:
      if (!commit_status_.ok()) return;
      if (output_ != nullptr) {
        if (absl::Status s = output_->CommitMetrics(); !s.ok()) return CommitFailed(s);
        if (absl::Status s = output_->CommitTensorBoard(); !s.ok()) return CommitFailed(s);
      }
      break;
    case v1::TrainingEvent::kCheckpointSaved:
      if (!commit_status_.ok()) return;
      if (output_ != nullptr) {
        absl::StatusOr<std::string> path =
            output_->CommitCheckpoint(event.checkpoint_saved().path());
        if (!path.ok()) return CommitFailed(path.status());
        v1::TrainingEvent committed = event;
        committed.mutable_checkpoint_saved()->set_path(*path);
        if (channel_ != nullptr) channel_->OnEvent(committed);
        return;
      }
      break;
    case v1::TrainingEvent::kGuard:
      if (!commit_status_.ok()) return;
      // The guard's text for TensorBoard (and a rollback's session start),
      // which the Reporter writes before it reports the event.
      if (output_ != nullptr) {
        if (absl::Status s = output_->CommitTensorBoard(); !s.ok()) return CommitFailed(s);
      }
      break;
    default:
      break;
  }
  if (channel_ != nullptr) channel_->OnEvent(event);
}

bool RankObserver::StopRequested() {
  return !commit_status_.ok() || sigterm_received.load() ||
         (channel_ != nullptr && channel_->CancelRequested());
}

}  // namespace ballast::train
