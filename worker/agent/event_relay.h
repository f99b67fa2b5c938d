// EventRelay: delivers RankEvents to the coordinator with ReportEvents, at
// least once.
//
// Events are sent in the order they were added, in batches. A batch is kept
// until the coordinator acknowledges its report_id, and is resent unchanged
// (same report_id) after an error, with backoff. While the coordinator is
// unreachable up to `max_buffered` events wait; past that the oldest step
// metrics are dropped first (then the oldest events of any kind), and a
// LogLine event per affected rank says how many were lost.
//
// report_ids start at the worker's start time in microseconds and grow by one
// per batch, so they keep increasing across worker restarts.
//
// Thread-safe.
#ifndef BALLAST_WORKER_AGENT_EVENT_RELAY_H_
#define BALLAST_WORKER_AGENT_EVENT_RELAY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/worker_service.pb.h"
#include "worker/agent/coordinator_connection.h"

namespace ballast::agent {

struct EventRelayOptions {
  size_t max_buffered = 100000;
  size_t max_batch = 1000;
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
};

class EventRelay {
 public:
  // Starts the sender thread. Nothing is sent before SetWorkerId.
  // `coordinator` must outlive the relay.
  EventRelay(CoordinatorConnection* coordinator, EventRelayOptions options = {});

  // Cancels a call in flight and joins the sender; unsent events are lost
  // (call Flush first to deliver them).
  ~EventRelay();

  EventRelay(const EventRelay&) = delete;
  EventRelay& operator=(const EventRelay&) = delete;

  // The id to report under; batches in flight are resent under the new id.
  void SetWorkerId(const std::string& worker_id) ABSL_LOCKS_EXCLUDED(mu_);

  // Queues one event. Never blocks on the network.
  void Add(v1::RankEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits until every queued event is acknowledged, or the deadline. OK, or
  // DEADLINE_EXCEEDED saying how many events are still unacknowledged and
  // the last error.
  absl::Status Flush(absl::Time deadline) ABSL_LOCKS_EXCLUDED(mu_);

  // Events not yet acknowledged (queued and in flight).
  size_t Unacknowledged() const ABSL_LOCKS_EXCLUDED(mu_);

  // Events dropped because the buffer was full, since the start.
  int64_t Dropped() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Identifies one rank of one attempt, for the drop notices.
  using RankKey = std::tuple<std::string, int32_t, int32_t>;

  void SendLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void DropOneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FillBatchLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadyToSend() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Drained() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorConnection* const coordinator_;
  const EventRelayOptions options_;

  mutable absl::Mutex mu_;
  std::string worker_id_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::RankEvent> queue_ ABSL_GUARDED_BY(mu_);
  // The batch sent and not yet acknowledged.
  std::optional<v1::ReportEventsRequest> in_flight_ ABSL_GUARDED_BY(mu_);
  int64_t next_report_id_ ABSL_GUARDED_BY(mu_);
  std::map<RankKey, int64_t> dropped_unreported_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_total_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* active_call_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  std::thread sender_;
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_EVENT_RELAY_H_
