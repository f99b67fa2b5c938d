// AgentChannel: the rank's end of the Unix-socket channel to its
// ballast-worker (see proto/ballast/v1/rank_channel.proto).
//
// Reports go up as delimited RankMessages. RankControl comes down and is read
// by the channel's own thread as it arrives, so a rank in a long step still
// hears its worker: a Cancel is kept until the trainer polls StopRequested
// between steps, and a Keepalive resets the silence clock. With a silence
// limit, a worker that sends no Keepalive for that long is presumed frozen,
// dead or cut off from the coordinator, which will hand the rank's work to
// another worker once the lease and the limit have run out; the channel then
// calls `on_silent`, which fences the rank (it exits without writing more).
//
// A worker that has gone away never fails a report: writes use MSG_NOSIGNAL,
// the first failed write marks the channel broken, and later reports are
// dropped (metrics.jsonl still has them).
//
// The same thread reports the rank's phase for the progress watchdog (see
// PhaseSource): a phase is sent once it has held for `hold`, so a training
// thread that moves on sends none, and one stuck anywhere is reported by a
// thread that is not stuck with it.
//
// Thread-safe.
#ifndef BALLAST_WORKER_TRAIN_RANK_AGENT_CHANNEL_H_
#define BALLAST_WORKER_TRAIN_RANK_AGENT_CHANNEL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/rank_channel.pb.h"
#include "common/rank_frames.h"
#include "worker/train/trainer/training_observer.h"

namespace ballast::train {

// The longest log line sent up, in bytes; a longer one (an error quoting a
// whole record, say) is cut at a character boundary and says how much went.
// Each line becomes an event that ballastd stores and every watcher gets.
inline constexpr size_t kMaxLogLineBytes = 16 << 10;

// When the rank gives up on a silent worker.
struct SilenceFence {
  // Zero (the default): never; the rank trains on without keepalives.
  // Measured on the monotonic clock, which also runs while a process is
  // stopped (SIGSTOP), so a frozen rank fences itself as soon as it resumes.
  std::chrono::milliseconds limit{0};
  // Called once, on the channel's thread, with how long the worker has been
  // silent; meant not to return (ballast-train prints why and _exits). If it
  // does return, the channel stops reading control messages.
  std::function<void(std::chrono::milliseconds silent)> on_silent;
};

// Where the rank is within its step (worker/train/collectives/step_phase.h,
// which this library does not link: it runs without LibTorch in the agent's
// tests).
struct PhaseSource {
  // The phase now, with a number that changes whenever the rank moves;
  // nullopt while it trains no step (loading, say). Called on the channel's
  // thread. Null: no phase is reported.
  std::function<std::optional<std::pair<uint64_t, v1::RankPhase>>()> read;
  // A phase is reported once it has held this long (seen by polls 100 ms
  // apart at most): far below the watchdog's least stall bound (1 s), and
  // long enough that a step's per-layer moves send nothing.
  std::chrono::milliseconds hold{500};
};

class AgentChannel : public TrainingObserver {
 public:
  // Connects to the worker listening at `path`; `rank` goes into log lines.
  // The silence clock starts now. UNAVAILABLE names the path when nothing
  // listens there; INVALID_ARGUMENT when the path does not fit sun_path.
  static absl::StatusOr<std::unique_ptr<AgentChannel>> Connect(const std::string& path, int rank,
                                                               SilenceFence fence = {},
                                                               PhaseSource phases = {});

  // Stops the reader thread (within its poll period) and closes the socket.
  ~AgentChannel() override;
  AgentChannel(const AgentChannel&) = delete;
  AgentChannel& operator=(const AgentChannel&) = delete;

  // Writes one message. UNAVAILABLE once the worker's end is gone (and for
  // every later call).
  absl::Status Send(const v1::RankMessage& message) ABSL_LOCKS_EXCLUDED(send_mu_);

  // True once a Cancel has been received; never blocks.
  bool CancelRequested() const { return cancelled_.load(); }

  // TrainingObserver: each report becomes one RankMessage holding the
  // TrainingEvent as it came, but a log line, which gets this rank and is
  // cut to kMaxLogLineBytes.
  void OnEvent(const v1::TrainingEvent& event) override;
  bool StopRequested() override { return CancelRequested(); }

 private:
  AgentChannel(int fd, int rank, SilenceFence fence, PhaseSource phases);
  // The reader thread: control messages in, silence watched.
  void ReadLoop();
  // Acts on every whole control message in `frames`; a partial one stays.
  // False once the stream cannot be delimited any more (DATA_LOSS there).
  bool TakeControl(RankFrameReader* frames, std::chrono::steady_clock::time_point* last_keepalive);
  // Sends the phase if it has held for phases_.hold and was not sent yet.
  void ReportHeldPhase();

  const int fd_;
  const int rank_;
  const SilenceFence fence_;
  const PhaseSource phases_;
  // Reader thread only: the phase version seen last, when, and whether it
  // was sent.
  uint64_t phase_seen_ = 0;
  std::chrono::steady_clock::time_point phase_seen_at_;
  bool phase_sent_ = true;
  // One message at a time on the socket, from either thread.
  absl::Mutex send_mu_;
  bool broken_ ABSL_GUARDED_BY(send_mu_) = false;
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> closing_{false};
  std::thread reader_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_AGENT_CHANNEL_H_
