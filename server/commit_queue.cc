#include "server/commit_queue.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/family.h"

namespace ballast::server {

CommitQueue::CommitQueue(Store* store, int64_t event_retention, MetricsRegistry* metrics)
    : store_(store),
      event_retention_(event_retention),
      commit_seconds_(
          prometheus::BuildHistogram()
              .Name("ballast_store_write_seconds")
              .Help("Time of one write to the job store, by op; a commit is one transaction "
                    "holding the changes of every call queued while the previous one was written.")
              .Register(metrics->registry())
              .Add({{"op", "commit"}},
                   std::vector<double>{1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5})) {
  writer_ = std::thread([this] { WriterLoop(); });
}

CommitQueue::~CommitQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  writer_.join();
}

CommitQueue::Ticket CommitQueue::Queue(StoreBatch batch, Then then) {
  if (batch.jobs.empty() && batch.workers.empty()) return 0;
  absl::MutexLock lock(&mu_);
  queued_.push_back({++last_queued_, std::move(batch), std::move(then)});
  return last_queued_;
}

absl::Status CommitQueue::Wait(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto written = [this, ticket]()
                     ABSL_NO_THREAD_SAFETY_ANALYSIS { return last_written_ >= ticket; };
  mu_.Await(absl::Condition(
      +[](decltype(written)* w) { return (*w)(); }, &written));
  return TakeOutcome(ticket);
}

void CommitQueue::WhenWritten(Ticket ticket, Done done) {
  absl::Status outcome;
  {
    absl::MutexLock lock(&mu_);
    if (last_written_ < ticket) {
      callbacks_.emplace(ticket, std::move(done));
      return;
    }
    outcome = TakeOutcome(ticket);
  }
  done(outcome);
}

absl::Status CommitQueue::TakeOutcome(Ticket ticket) {
  auto failed = failed_.find(ticket);
  if (failed == failed_.end()) return absl::OkStatus();
  absl::Status status = std::move(failed->second);
  failed_.erase(failed);
  return status;
}

void CommitQueue::WriterLoop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    mu_.Await(absl::Condition(
        +[](CommitQueue* q)
             ABSL_NO_THREAD_SAFETY_ANALYSIS { return !q->queued_.empty() || q->stopping_; },
        this));
    // Stops only once nothing is queued: every queued batch gets written.
    if (queued_.empty()) return;
    std::vector<Pending> group = std::exchange(queued_, {});
    mu_.Unlock();
    const std::vector<absl::Status> statuses = Write(group);
    mu_.Lock();
    // (callback, outcome) of the group's tickets that have one.
    std::vector<std::pair<Done, absl::Status>> ready;
    for (size_t i = 0; i < group.size(); ++i) {
      auto callback = callbacks_.find(group[i].ticket);
      if (callback != callbacks_.end()) {
        ready.emplace_back(std::move(callback->second), statuses[i]);
        callbacks_.erase(callback);
      } else if (!statuses[i].ok()) {
        failed_.emplace(group[i].ticket, statuses[i]);
      }
    }
    // Waiters wake on this (Await rechecks on every unlock).
    last_written_ = group.back().ticket;
    mu_.Unlock();
    for (auto& [done, status] : ready) done(status);
    mu_.Lock();
  }
}

std::vector<absl::Status> CommitQueue::Write(std::vector<Pending>& group) {
  std::vector<const StoreBatch*> batches;
  batches.reserve(group.size());
  for (const Pending& p : group) batches.push_back(&p.batch);
  const absl::Time start = absl::Now();
  const absl::Status status = store_->Write(batches, event_retention_);
  commit_seconds_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
  std::vector<absl::Status> statuses(group.size(), status);
  if (!status.ok() && group.size() > 1) {
    for (size_t i = 0; i < group.size(); ++i) {
      statuses[i] = store_->Write({&group[i].batch}, event_retention_);
    }
  }
  for (size_t i = 0; i < group.size(); ++i) group[i].then(group[i].batch, statuses[i]);
  return statuses;
}

}  // namespace ballast::server
