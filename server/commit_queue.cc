#include "server/commit_queue.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ballast::server {

CommitQueue::CommitQueue(Store* store, int64_t event_retention, MetricsRegistry* metrics)
    : store_(store), event_retention_(event_retention), metrics_(metrics) {
  metrics_->Describe(
      "ballast_store_write_seconds",
      "Time of one write to the job store, by op; a commit is one transaction holding the "
      "changes of every call queued while the previous one was written.",
      MetricType::kHistogram, {1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5});
}

CommitQueue::Ticket CommitQueue::Queue(StoreBatch batch, Then then) {
  if (batch.jobs.empty() && batch.workers.empty()) return 0;
  absl::MutexLock lock(&mu_);
  queued_.push_back({++last_queued_, std::move(batch), std::move(then)});
  return last_queued_;
}

absl::Status CommitQueue::Wait(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  while (last_written_ < ticket) {
    if (writing_) {
      written_cv_.Wait(&mu_);
      continue;
    }
    // Not written and no write under way: the batch is still queued, and
    // this caller writes it with everything queued beside it.
    writing_ = true;
    std::vector<Pending> group = std::exchange(queued_, {});
    mu_.Unlock();
    const std::vector<absl::Status> statuses = Write(group);
    mu_.Lock();
    for (size_t i = 0; i < group.size(); ++i) {
      if (!statuses[i].ok()) failed_.emplace(group[i].ticket, statuses[i]);
    }
    last_written_ = group.back().ticket;
    writing_ = false;
    written_cv_.SignalAll();
  }
  auto failed = failed_.find(ticket);
  if (failed == failed_.end()) return absl::OkStatus();
  absl::Status status = std::move(failed->second);
  failed_.erase(failed);
  return status;
}

std::vector<absl::Status> CommitQueue::Write(std::vector<Pending>& group) {
  std::vector<const StoreBatch*> batches;
  batches.reserve(group.size());
  for (const Pending& p : group) batches.push_back(&p.batch);
  const absl::Time start = absl::Now();
  const absl::Status status = store_->Write(batches, event_retention_);
  metrics_->Observe("ballast_store_write_seconds", {{"op", "commit"}},
                    absl::ToDoubleSeconds(absl::Now() - start));
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
