#include "server/scheduler.h"

#include <algorithm>

namespace ballast::server {

void Scheduler::Enqueue(const std::string& job_id, int32_t priority, int64_t order,
                        int32_t devices) {
  Dequeue(job_id);
  QueueKey key{priority, order, job_id};
  queue_.emplace(key, devices);
  queued_keys_.emplace(job_id, std::move(key));
}

bool Scheduler::Dequeue(const std::string& job_id) {
  auto it = queued_keys_.find(job_id);
  if (it == queued_keys_.end()) return false;
  queue_.erase(it->second);
  queued_keys_.erase(it);
  return true;
}

void Scheduler::AddWorker(const std::string& worker_id, int32_t capacity) {
  Worker& w = workers_[worker_id];
  if (static_cast<int32_t>(w.busy.size()) != capacity) {
    w.busy.assign(std::max(capacity, 0), false);
    w.free = std::max(capacity, 0);
  }
}

void Scheduler::RemoveWorker(const std::string& worker_id) { workers_.erase(worker_id); }

bool Scheduler::Occupy(const std::string& worker_id, int32_t device) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || device < 0 ||
      device >= static_cast<int32_t>(it->second.busy.size()) || it->second.busy[device]) {
    return false;
  }
  it->second.busy[device] = true;
  --it->second.free;
  return true;
}

void Scheduler::Release(const std::string& worker_id, int32_t device) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || device < 0 ||
      device >= static_cast<int32_t>(it->second.busy.size()) || !it->second.busy[device]) {
    return;
  }
  it->second.busy[device] = false;
  ++it->second.free;
}

int64_t Scheduler::busy_devices() const {
  int64_t busy = 0;
  for (const auto& [id, w] : workers_) busy += static_cast<int64_t>(w.busy.size()) - w.free;
  return busy;
}

int64_t Scheduler::free_devices() const {
  int64_t free = 0;
  for (const auto& [id, w] : workers_) free += w.free;
  return free;
}

void Scheduler::Take(const std::string& worker_id, int32_t count, Decision* decision) {
  Worker& w = workers_.at(worker_id);
  for (int32_t d = 0; d < static_cast<int32_t>(w.busy.size()) && count > 0; ++d) {
    if (w.busy[d]) continue;
    w.busy[d] = true;
    --w.free;
    --count;
    v1::RankPlacement& p = decision->ranks.emplace_back();
    p.set_rank(static_cast<int32_t>(decision->ranks.size()) - 1);
    p.set_worker_id(worker_id);
    p.set_device(d);
  }
}

std::vector<Decision> Scheduler::Schedule() {
  Index index;
  int64_t usable_free = 0;
  for (const auto& [id, w] : workers_) {
    index.emplace(w.free, &id);
    usable_free += w.free;
  }
  bool reserved = false;
  std::vector<Decision> decisions;
  for (auto it = queue_.begin(); it != queue_.end() && usable_free > 0;) {
    const int32_t need = it->second;
    if (need > usable_free) {
      if (!reserved) {
        reserved = true;
        // The head's reservation: one worker big enough, the one nearest to
        // free (most free now); else the workers with the most free until
        // their capacity suffices. Nothing is reserved for a job larger than
        // every live worker together, which would otherwise block everything.
        std::vector<Index::iterator> pick;
        for (auto w = index.rbegin(); w != index.rend(); ++w) {
          if (static_cast<int32_t>(workers_.at(*w->second).busy.size()) >= need) {
            pick.push_back(std::next(w).base());
            break;
          }
        }
        if (pick.empty()) {
          int64_t capacity = 0;
          for (auto w = index.rbegin(); w != index.rend() && capacity < need; ++w) {
            pick.push_back(std::next(w).base());
            capacity += static_cast<int64_t>(workers_.at(*w->second).busy.size());
          }
          if (capacity < need) pick.clear();
        }
        for (const Index::iterator& w : pick) {
          usable_free -= w->first;
          index.erase(w);
        }
      }
      ++it;
      continue;
    }
    Decision decision;
    decision.job_id = it->first.job_id;
    static const std::string kBeforeEveryId;
    auto fits = index.lower_bound({need, &kBeforeEveryId});
    if (fits != index.end()) {
      const std::string* id = fits->second;
      index.erase(fits);
      Take(*id, need, &decision);
      index.emplace(workers_.at(*id).free, id);
    } else {
      int32_t left = need;
      while (left > 0) {
        auto largest = std::prev(index.end());
        const auto [free, id] = *largest;
        index.erase(largest);
        Take(*id, std::min(left, free), &decision);
        left -= std::min(left, free);
        index.emplace(workers_.at(*id).free, id);
      }
    }
    usable_free -= need;
    queued_keys_.erase(it->first.job_id);
    it = queue_.erase(it);
    decisions.push_back(std::move(decision));
  }
  return decisions;
}

}  // namespace ballast::server
