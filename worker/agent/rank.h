// Rank: one ballast-train process an assignment asked for, with its socket,
// its scratch folder, and the RankEvents it produces.
//
// Start writes the spec to SCRATCH/spec.json, listens on the socket, starts
// the trainer, and queues RankStarted. Each RankMessage from the socket is
// queued as a RankEvent; when the process has exited and the socket is
// drained, RankExited is queued and the rank is finished.
//
// Thread-safe.
#ifndef BALLAST_WORKER_AGENT_RANK_H_
#define BALLAST_WORKER_AGENT_RANK_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/worker_service.pb.h"
#include "worker/agent/event_relay.h"
#include "worker/agent/rank_process.h"
#include "worker/agent/rank_socket.h"

namespace ballast::agent {

// Where and how this worker runs its ranks.
struct RankEnvironment {
  std::string train_binary;
  // "cuda" sets CUDA_VISIBLE_DEVICES to the assignment's device; "cpu" sets
  // OMP_NUM_THREADS to cpu_threads and hides GPUs.
  std::string device_kind;
  int cpu_threads = 1;
  // ballast-train's --collective-timeout: how long a rank of a gang may go
  // without a heartbeat before its peers count it lost.
  double collective_timeout_s = 60;
  // Created for the rank, removed with it.
  std::string scratch_dir;
  std::string socket_path;
};

// The trainer's command line for an assignment (argv without argv[0]).
std::vector<std::string> TrainArguments(const v1::Assignment& assignment,
                                        const std::string& spec_path,
                                        const std::string& socket_path);

// Writes the spec as proto JSON. `path` must end in ".json": ballast-train
// then reads it with protobuf's JSON parser (LoadJobSpecFile), not as YAML.
absl::Status WriteSpecJson(const v1::JobSpec& spec, const std::string& path);

// Kills (SIGKILL, whole process group) the ranks a previous run of the worker
// left behind in `ranks_dir` (WORK_DIR/ranks), and removes their scratch
// folders. They cannot be supervised by this run, and the coordinator
// restarts their jobs elsewhere. A pid counts only while its command line
// still names that folder's spec, so a reused pid is never hit. Returns how
// many processes were killed.
int StopOrphanedRanks(const std::string& ranks_dir);

class Rank {
 public:
  // Starts the rank. On error nothing is left running and no event queued.
  // `on_finished` runs (on an internal thread) once RankExited is queued; it
  // must not destroy the Rank. `relay` must outlive the Rank.
  static absl::StatusOr<std::unique_ptr<Rank>> Start(const v1::Assignment& assignment,
                                                     const RankEnvironment& env, EventRelay* relay,
                                                     std::function<void()> on_finished);

  // Kills the process if it still runs, joins, removes the scratch folder.
  ~Rank();

  const v1::RankRef& ref() const { return ref_; }
  pid_t pid() const { return process_->pid(); }

  // Asks the rank to stop at its next step boundary (RankControl.cancel with
  // `reason` on its socket; SIGTERM, which the trainer takes the same way,
  // when the socket cannot carry it), and SIGKILLs it if it still runs
  // `grace` later. RankExited says stopped=true. Later calls do nothing.
  void Stop(absl::Duration grace, const std::string& reason);

  // Tells the rank its worker still holds its lease (RankControl.keepalive).
  // Never blocks; a rank that is not connected yet or is gone misses it.
  void SendKeepalive();

  // The Assignment's agent_silence_ms: how long the rank waits for a
  // keepalive before it fences itself; zero when it does not.
  absl::Duration agent_silence() const { return agent_silence_; }

  // True once RankExited has been queued.
  bool Finished() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Rank(v1::RankRef ref, absl::Duration agent_silence, RankEnvironment env, EventRelay* relay,
       std::function<void()> on_finished);
  v1::RankEvent NewEvent() const;
  void OnMessage(const v1::RankMessage& message);
  void OnExit(const ProcessExit& exit) ABSL_LOCKS_EXCLUDED(mu_);

  const v1::RankRef ref_;
  const absl::Duration agent_silence_;
  const RankEnvironment env_;
  EventRelay* const relay_;
  const std::function<void()> on_finished_;

  mutable absl::Mutex mu_;
  // RankStarted is queued: RankExited may follow.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;

  // Destroyed in reverse order: the process (and its exit callback, which
  // drains the socket) goes before the socket.
  std::unique_ptr<RankSocket> socket_;
  std::unique_ptr<RankProcess> process_;
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_RANK_H_
