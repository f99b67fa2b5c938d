// Agent: the worker's life with the coordinator. It registers this node's
// devices (re-registering with its previous id and running ranks after a
// restart of either side), renews its lease with heartbeats, keeps one
// StreamAssignments open (reconnecting with backoff, 100 ms doubling to 5 s),
// starts and stops ranks as assignments say, and relays their events.
//
// Fencing: while its lease is fresh (less than lease_ms since it sent the
// last heartbeat the coordinator accepted) the agent sends each rank a
// keepalive on its socket several times per the rank's silence limit. Once
// the lease lapses it sends none and asks its ranks to stop; a rank that
// hears nothing for its limit stops by itself, so even a frozen agent's
// ranks are gone before the coordinator hands their work to another worker.
//
// Thread-safe: Start and Shutdown are called by the owner; everything else
// runs on the agent's own threads.
#ifndef BALLAST_WORKER_AGENT_AGENT_H_
#define BALLAST_WORKER_AGENT_AGENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "worker/agent/coordinator_connection.h"
#include "worker/agent/device_discovery.h"
#include "worker/agent/event_relay.h"
#include "worker/agent/rank.h"

namespace ballast::agent {

struct AgentOptions {
  std::string coordinator;  // HOST:PORT, or several comma-separated (CoordinatorConnection)
  std::string token;        // BALLAST_TOKEN; empty sends none
  // TLS to the coordinator (--tls-ca/--tls-cert/--tls-key); empty is plain.
  TlsFiles tls;
  std::string work_dir;  // worker-id file and rank scratch folders
  std::string train_binary;
  std::string host;  // reported to the coordinator for rendezvous
  Devices devices;
  // SIGTERM -> SIGKILL delay for ranks when the worker itself shuts down.
  absl::Duration shutdown_grace = absl::Seconds(5);
  // How long Shutdown tries to deliver the last events.
  absl::Duration shutdown_flush = absl::Seconds(2);
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Given to every rank (RankEnvironment::collective_timeout_s).
  double collective_timeout_s = 60;
};

// A prometheus::Collectable: its node series are computed at scrape time.
class Agent : public prometheus::Collectable {
 public:
  explicit Agent(AgentOptions options);
  // Calls Shutdown.
  ~Agent() override;

  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  // Creates the work and socket folders, reads WORK_DIR/worker-id, and starts
  // the agent's threads; returns at once (registration retries in the
  // background until the coordinator answers). INTERNAL names a folder that
  // cannot be created.
  absl::Status Start() ABSL_LOCKS_EXCLUDED(mu_);

  // Stops taking assignments, stops every rank (SIGTERM, SIGKILL after
  // shutdown_grace), delivers what it can within shutdown_flush, and joins
  // every thread. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  // The worker's own metrics, for its --http endpoint:
  // ballast_node_ranks_running and ballast_node_devices{kind, state} with
  // state busy (a running rank holds it) or free.
  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_) override;

  // OK once the coordinator has accepted this worker's registration;
  // UNAVAILABLE, saying so, before (the worker's /healthz).
  absl::Status Health() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using RankKey = std::tuple<std::string, int32_t, int32_t>;  // job, attempt, rank

  // Registration.
  absl::Status RegisterOnce() ABSL_LOCKS_EXCLUDED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);
  bool RegisterUntilDone() ABSL_LOCKS_EXCLUDED(mu_) ABSL_EXCLUSIVE_LOCKS_REQUIRED(register_mu_);
  void Reregister(int64_t seen_epoch) ABSL_LOCKS_EXCLUDED(mu_, register_mu_);
  void SaveWorkerId(const std::string& id) const;

  // Threads.
  void SessionLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void HeartbeatLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void JanitorLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void KeepaliveLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // A heartbeat or registration sent at `sent` was accepted with `lease`.
  void RenewLease(std::chrono::steady_clock::time_point sent, int64_t lease_ms)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Assignments.
  void Handle(const v1::Assignment& assignment) ABSL_LOCKS_EXCLUDED(mu_);
  void StartRank(const v1::Assignment& assignment) ABSL_LOCKS_EXCLUDED(mu_);
  void StopRanks(const v1::Assignment& assignment) ABSL_LOCKS_EXCLUDED(mu_);
  void ReportStartFailure(const v1::Assignment& assignment, const absl::Status& error);

  std::vector<v1::RankRef> RunningLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes a call cancellable by Shutdown; the guard unregisters it.
  class TrackedCall;
  // Sleeps `d` or until Shutdown; false when shutting down.
  bool SleepFor(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);

  bool Stopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; }
  bool StoppingOrRegistered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || epoch_ > 0;
  }
  bool StoppingOrFinished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || finished_pending_ > 0;
  }

  const AgentOptions options_;
  const int cpu_threads_;
  std::string socket_dir_;
  std::unique_ptr<CoordinatorConnection> coordinator_;
  std::unique_ptr<EventRelay> relay_;

  // Serialises registrations, so two threads that both see NOT_FOUND
  // register once. Taken before mu_.
  absl::Mutex register_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  // Counts successful registrations; 0 before the first.
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(5);
  // Until when the coordinator surely still counts this worker alive: the
  // send time of the last accepted heartbeat plus the lease. Monotonic, so
  // that a freeze (SIGSTOP) or a clock step cannot stretch it.
  std::chrono::steady_clock::time_point lease_until_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, std::unique_ptr<Rank>> ranks_ ABSL_GUARDED_BY(mu_);
  int finished_pending_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_socket_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread session_;
  std::thread heartbeat_;
  std::thread janitor_;
  std::thread keepalive_;
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_AGENT_H_
