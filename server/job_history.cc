#include "server/job_history.h"

#include <algorithm>

namespace ballast::server {

void JobHistory::Load(std::vector<std::pair<std::string, int64_t>> loaded,
                      std::map<int, int64_t> evicted_by_state) {
  absl::MutexLock lock(&mu_);
  std::sort(loaded.begin(), loaded.end(),
            [](const auto& a, const auto& b) { return a.second < b.second; });
  recent_.assign(std::make_move_iterator(loaded.begin()), std::make_move_iterator(loaded.end()));
  while (recent_.size() > kept_) DropOldest();
  evicted_by_state_ = std::move(evicted_by_state);
}

void JobHistory::Finished(std::string job_id, int64_t finished_ms) {
  absl::MutexLock lock(&mu_);
  recent_.emplace_back(std::move(job_id), finished_ms);
  if (recent_.size() > kept_) DropOldest();
}

void JobHistory::DropOldest() {
  to_evict_.push_back(std::move(recent_.front().first));
  recent_.pop_front();
}

bool JobHistory::Expire(int64_t now_ms) {
  absl::MutexLock lock(&mu_);
  bool expired = false;
  while (!recent_.empty() && now_ms - recent_.front().second > retention_ms_) {
    DropOldest();
    expired = true;
  }
  return expired;
}

std::vector<std::string> JobHistory::Shown(int64_t now_ms) const {
  absl::MutexLock lock(&mu_);
  auto it = recent_.begin();
  while (it != recent_.end() && now_ms - it->second > retention_ms_) ++it;
  std::vector<std::string> shown;
  for (; it != recent_.end(); ++it) shown.push_back(it->first);
  return shown;
}

std::vector<std::string> JobHistory::TakeToEvict() {
  absl::MutexLock lock(&mu_);
  return std::exchange(to_evict_, {});
}

void JobHistory::EvictLater(std::string job_id) {
  absl::MutexLock lock(&mu_);
  to_evict_.push_back(std::move(job_id));
}

void JobHistory::EvictionStored(std::string job_id, bool stored) {
  absl::MutexLock lock(&mu_);
  stored_evictions_.emplace_back(std::move(job_id), stored);
}

std::vector<std::pair<std::string, bool>> JobHistory::TakeStoredEvictions() {
  absl::MutexLock lock(&mu_);
  return std::exchange(stored_evictions_, {});
}

bool JobHistory::HasStoredEvictions() const {
  absl::MutexLock lock(&mu_);
  return !stored_evictions_.empty();
}

void JobHistory::Evicted(v1::JobState state) {
  absl::MutexLock lock(&mu_);
  ++evicted_by_state_[state];
}

std::map<int, int64_t> JobHistory::EvictedByState() const {
  absl::MutexLock lock(&mu_);
  return evicted_by_state_;
}

absl::StatusOr<int64_t> JobHistory::Prune(Store* store, int64_t job_history, int64_t per_pass) {
  int64_t keep_evicted;
  {
    // The newest finished jobs are in memory; the rest kept are in the store.
    absl::MutexLock lock(&mu_);
    keep_evicted = std::max<int64_t>(0, job_history - static_cast<int64_t>(recent_.size()));
  }
  absl::StatusOr<std::map<int, int64_t>> pruned = store->PruneEvictedJobs(keep_evicted, per_pass);
  if (!pruned.ok()) return pruned.status();
  int64_t total = 0;
  absl::MutexLock lock(&mu_);
  for (const auto& [state, n] : *pruned) {
    evicted_by_state_[state] -= n;
    total += n;
  }
  return total;
}

}  // namespace ballast::server
