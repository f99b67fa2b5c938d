// EventWatch: one WatchJob stream, the retained events of a job after a seq,
// then the live ones. The coordinator makes it (Coordinator::WatchJob): it
// replays the store up to the seq its mailbox joined the job's EventFanout
// at, then reads the mailbox, so no event is missed or seen twice.
//
// Not thread-safe: one reader. Must not outlive the Coordinator, whose store
// it reads.
#ifndef BALLAST_SERVER_EVENT_WATCH_H_
#define BALLAST_SERVER_EVENT_WATCH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ballast/v1/job.pb.h"
#include "server/event_fanout.h"
#include "server/mailbox.h"
#include "server/store.h"

namespace ballast::server {

class EventWatch {
 public:
  ~EventWatch();
  EventWatch(const EventWatch&) = delete;
  EventWatch& operator=(const EventWatch&) = delete;

  // Appends the next events in seq order to *out, waiting up to `wait` when
  // there are none. Returns true while more may come, false once the job's
  // terminal state change has been handed out. UNAVAILABLE when the
  // coordinator shuts down.
  absl::StatusOr<bool> Next(std::vector<v1::JobEvent>* out, absl::Duration wait);

 private:
  friend class Coordinator;
  // Replays `store` up to joined.published_seq, then reads the mailbox.
  // `done`: the watcher has seen the job's last event already.
  EventWatch(Store* store, std::string job_id, int64_t after_seq, bool done,
             std::shared_ptr<EventFanout> fanout, EventFanout::Joined joined);
  // Reads stored events with seq in (last_seq_, through] into *out.
  absl::Status ReadStored(int64_t through, std::vector<v1::JobEvent>* out);
  void Deliver(std::vector<v1::JobEvent> events, std::vector<v1::JobEvent>* out);

  Store* const store_;
  const std::string job_id_;
  int64_t last_seq_;
  // Stored events up to here come from the store, later ones from the mailbox.
  int64_t replay_through_;
  bool replayed_ = false;
  bool done_ = false;
  std::shared_ptr<EventFanout> fanout_;
  std::shared_ptr<Mailbox<v1::JobEvent>> mailbox_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_EVENT_WATCH_H_
