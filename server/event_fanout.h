// EventFanout: the watchers of one job's events, and how far those events
// have been handed out. The coordinator publishes events only once they are
// stored, in seq order, so a watcher that joins gets through its mailbox
// exactly the events published after it joined, and finds every earlier one
// in the store: replaying the store up to the seq Join returns, then reading
// the mailbox, leaves no gap. Thread-safe.
#ifndef BALLAST_SERVER_EVENT_FANOUT_H_
#define BALLAST_SERVER_EVENT_FANOUT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/job.pb.h"
#include "server/mailbox.h"

namespace ballast::server {

class EventFanout {
 public:
  using Watcher = std::shared_ptr<Mailbox<v1::JobEvent>>;
  struct Joined {
    Watcher mailbox;
    // Every event up to this seq was published before the mailbox joined.
    int64_t published_seq;
  };

  // `published_seq`: the job's events already stored (and so handed out).
  explicit EventFanout(int64_t published_seq = 0) : published_seq_(published_seq) {}

  // Adds a watcher whose mailbox holds up to `capacity` events.
  Joined Join(size_t capacity) {
    absl::MutexLock lock(&mu_);
    Watcher mailbox = std::make_shared<Mailbox<v1::JobEvent>>(capacity);
    watchers_.push_back(mailbox);
    return {std::move(mailbox), published_seq_};
  }

  void Leave(const Mailbox<v1::JobEvent>* mailbox) {
    absl::MutexLock lock(&mu_);
    std::erase_if(watchers_, [&](const Watcher& w) { return w.get() == mailbox; });
  }

  // Hands the job's next events, in seq order, to every watcher.
  void Publish(const std::vector<v1::JobEvent>& events) {
    if (events.empty()) return;
    absl::MutexLock lock(&mu_);
    for (const Watcher& w : watchers_) w->Push(events);
    published_seq_ = events.back().seq();
  }

  // Ends every watcher's stream.
  void CloseAll() {
    absl::MutexLock lock(&mu_);
    for (const Watcher& w : watchers_) w->Close();
  }

 private:
  absl::Mutex mu_;
  std::vector<Watcher> watchers_ ABSL_GUARDED_BY(mu_);
  int64_t published_seq_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_EVENT_FANOUT_H_
