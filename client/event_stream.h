// Following a job's event stream (WatchJobBatched, or WatchJob from a
// coordinator older than it) across broken streams: after a coordinator
// restart it reconnects with the last seq seen, so every event reaches the
// caller exactly once and in order.
#ifndef BALLAST_CLIENT_EVENT_STREAM_H_
#define BALLAST_CLIENT_EVENT_STREAM_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ballast/v1/job.pb.h"
#include "client/connection.h"

namespace ballast::client {

struct FollowOptions {
  std::string job_id;
  // Deliver only events with seq > after_seq.
  int64_t after_seq = 0;
  // Stop after the event with this seq (the live edge); 0 follows the job to
  // its terminal state.
  int64_t stop_at_seq = 0;
  // How long to keep reconnecting after the stream broke before giving up.
  absl::Duration reconnect_window = absl::Seconds(60);
};

// Calls `on_event` once per event, in seq order. `on_notice` gets a sentence
// when the stream broke and reconnection starts. Returns the job's terminal
// state, or JOB_STATE_UNSPECIFIED when stop_at_seq was reached; UNAVAILABLE
// when the coordinator stayed away for the whole reconnect window; CANCELLED
// on interrupt; the coordinator's error (NOT_FOUND...) as is.
absl::StatusOr<v1::JobState> FollowEvents(Connection& connection, const FollowOptions& options,
                                          const std::function<void(const v1::JobEvent&)>& on_event,
                                          const std::function<void(const std::string&)>& on_notice);

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_EVENT_STREAM_H_
