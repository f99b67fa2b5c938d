// Group commit: the batches that concurrent callers queue while one
// transaction is being written go to the store together in the next one, so
// a hundred callers pay for one transaction (one WAL append of each page they
// touch), not a hundred, and no caller's lock is held while SQLite writes.
//
// A caller queues its batch (cheap, so the coordinator does it under its own
// lock, which makes the order of batches the order of the changes), lets go
// of its lock, and then either waits for its ticket or asks to be called back
// once it is written. The queue's writer thread takes every batch queued so
// far, writes them in one transaction, runs their `then` in queue order, and
// then wakes the waiters and runs the callbacks; batches queued meanwhile go
// in the next one. A callback lets a gRPC call finish from the writer, so no
// thread is held per call while the store writes.
//
// Thread-safe.
#ifndef BALLAST_SERVER_COMMIT_QUEUE_H_
#define BALLAST_SERVER_COMMIT_QUEUE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "prometheus/histogram.h"
#include "server/store.h"

namespace ballast::server {

class CommitQueue {
 public:
  // Names a queued batch; 0 names an empty one, which is never written.
  using Ticket = int64_t;
  // Runs once its batch's write is over, with its outcome, on the writer's
  // thread, after the `then` of every batch queued before it. Must not block.
  using Then = std::function<void(const StoreBatch& written, const absl::Status& status)>;
  // A ticket's outcome, as Wait returns it. Must not block.
  using Done = std::function<void(const absl::Status& status)>;

  // Starts the writer thread. `store` and `metrics` must outlive the queue;
  // `event_retention` is the events kept per job (Store::Write).
  CommitQueue(Store* store, int64_t event_retention, MetricsRegistry* metrics);
  // Writes every batch still queued, runs what waits for them, and stops
  // the writer.
  ~CommitQueue();
  CommitQueue(const CommitQueue&) = delete;
  CommitQueue& operator=(const CommitQueue&) = delete;

  // Queues `batch` and returns at once. An empty batch gets ticket 0 and its
  // `then` never runs.
  Ticket Queue(StoreBatch batch, Then then);

  // Returns once the batch of `ticket` has been written and its `then` has
  // run. OK, or the store's error for this batch alone: when a transaction
  // fails, its batches are tried again one by one, so one bad batch fails no
  // other. `then` runs whatever the outcome.
  absl::Status Wait(Ticket ticket);

  // Wait without waiting: runs `done` with what Wait would return, on the
  // writer's thread once the batch is written, or at once on the caller's
  // when it was already (ticket 0 included).
  void WhenWritten(Ticket ticket, Done done);

 private:
  struct Pending {
    Ticket ticket;
    StoreBatch batch;
    Then then;
  };
  void WriterLoop();
  // Writes `group` and runs its `then`s; returns each batch's status.
  std::vector<absl::Status> Write(std::vector<Pending>& group);
  // The status Wait returns for a written ticket; forgets a failure.
  absl::Status TakeOutcome(Ticket ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Store* const store_;
  const int64_t event_retention_;
  // ballast_store_write_seconds{op="commit"}.
  prometheus::Histogram& commit_seconds_;

  absl::Mutex mu_;
  std::vector<Pending> queued_ ABSL_GUARDED_BY(mu_);
  Ticket last_queued_ ABSL_GUARDED_BY(mu_) = 0;
  // Every batch up to this ticket has been written and handed to its `then`.
  Ticket last_written_ ABSL_GUARDED_BY(mu_) = 0;
  // Failed batches that no callback was registered for, until their waiter
  // learns of it.
  std::map<Ticket, absl::Status> failed_ ABSL_GUARDED_BY(mu_);
  // Callbacks of tickets not written yet.
  std::map<Ticket, Done> callbacks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_COMMIT_QUEUE_H_
