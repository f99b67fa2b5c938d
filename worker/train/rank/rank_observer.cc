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

void RankObserver::OnStep(const v1::StepMetrics& metrics) {
  if (!commit_status_.ok()) return;
  if (output_ != nullptr) {
    if (absl::Status s = output_->CommitMetrics(); !s.ok()) return CommitFailed(s);
  }
  if (channel_ != nullptr) channel_->OnStep(metrics);
}

void RankObserver::OnGuard(const v1::GuardEvent& event) {
  if (commit_status_.ok() && channel_ != nullptr) channel_->OnGuard(event);
}

void RankObserver::OnCheckpointSaved(const v1::CheckpointSaved& saved) {
  if (!commit_status_.ok()) return;
  v1::CheckpointSaved committed = saved;
  if (output_ != nullptr) {
    absl::StatusOr<std::string> path = output_->CommitCheckpoint(saved.path());
    if (!path.ok()) return CommitFailed(path.status());
    committed.set_path(*path);
  }
  if (channel_ != nullptr) channel_->OnCheckpointSaved(committed);
}

void RankObserver::OnData(const v1::DataReport& report) {
  if (channel_ != nullptr) channel_->OnData(report);
}

void RankObserver::OnEval(const v1::EvalReport& report) {
  if (channel_ != nullptr) channel_->OnEval(report);
}

void RankObserver::OnLog(const std::string& level, const std::string& text) {
  if (channel_ != nullptr) channel_->OnLog(level, text);
}

bool RankObserver::StopRequested() {
  return !commit_status_.ok() || sigterm_received.load() ||
         (channel_ != nullptr && channel_->CancelRequested());
}

}  // namespace ballast::train
