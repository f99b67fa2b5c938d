// AgentChannel: the rank's end of the Unix-socket channel to its
// ballast-worker (see proto/ballast/v1/rank_channel.proto).
//
// Reports go up as delimited RankMessages; RankControl comes down and is
// read without blocking between steps. A worker that has gone away never
// stops training: writes use MSG_NOSIGNAL, the first failed write marks the
// channel broken, and later reports are dropped (metrics.jsonl still has
// them).
//
// Not thread-safe: one training thread uses it.
#ifndef BALLAST_WORKER_TRAIN_AGENT_CHANNEL_H_
#define BALLAST_WORKER_TRAIN_AGENT_CHANNEL_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/rank_channel.pb.h"
#include "worker/train/training_observer.h"

namespace ballast::train {

class AgentChannel : public TrainingObserver {
 public:
  // Connects to the worker listening at `path`; `rank` goes into log lines.
  // UNAVAILABLE names the path when nothing listens there.
  static absl::StatusOr<std::unique_ptr<AgentChannel>> Connect(const std::string& path, int rank);

  ~AgentChannel() override;
  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;

  // Writes one message. UNAVAILABLE once the worker's end is gone (and for
  // every later call).
  absl::Status Send(const v1::RankMessage& message);

  // Reads whatever control messages have arrived, without blocking; true
  // once a Cancel has been received.
  bool CancelRequested();

  // TrainingObserver: each report becomes one RankMessage holding a TrainingEvent.
  void OnStep(const v1::StepMetrics& metrics) override;
  void OnGuard(const v1::GuardEvent& event) override;
  void OnCheckpointSaved(const v1::CheckpointSaved& saved) override;
  void OnLog(const std::string& level, const std::string& text) override;
  bool StopRequested() override { return CancelRequested(); }

 private:
  AgentChannel(int fd, int rank) : fd_(fd), rank_(rank) {}

  const int fd_;
  const int rank_;
  bool broken_ = false;
  bool cancelled_ = false;
  // Bytes read but not yet parsed: a control message may arrive in pieces.
  std::string pending_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_AGENT_CHANNEL_H_
