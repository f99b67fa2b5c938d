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

void Scheduler::Take(const std::string& worker_id, Worker* worker, int32_t count,
                     Decision* decision) {
  Worker& w = *worker;
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
  std::vector<std::pair<const std::string*, Worker*>> by_position;
  by_position.reserve(workers_.size());
  Index index;
  int64_t usable_free = 0;
  for (auto& [id, w] : workers_) {
    index.emplace_hint(index.end(), w.free, static_cast<int32_t>(by_position.size()));
    by_position.emplace_back(&id, &w);
    usable_free += w.free;
  }
  auto capacity = [&](int32_t position) {
    return static_cast<int32_t>(by_position[position].second->busy.size());
  };
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
          if (capacity(w->second) >= need) {
            pick.push_back(std::next(w).base());
            break;
          }
        }
        if (pick.empty()) {
          int64_t total = 0;
          for (auto w = index.rbegin(); w != index.rend() && total < need; ++w) {
            pick.push_back(std::next(w).base());
            total += capacity(w->second);
          }
          if (total < need) pick.clear();
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
    auto take = [&](Index::iterator entry, int32_t count) {
      const int32_t position = entry->second;
      index.erase(entry);
      auto [id, worker] = by_position[position];
      Take(*id, worker, count, &decision);
      index.emplace(worker->free, position);
    };
    // Position -1 sorts before every worker with the same free count.
    auto fits = index.lower_bound({need, -1});
    if (fits != index.end()) {
      take(fits, need);
    } else {
      for (int32_t left = need; left > 0;) {
        auto largest = std::prev(index.end());
        const int32_t count = std::min(left, largest->first);
        take(largest, count);
        left -= count;
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
