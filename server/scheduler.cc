#include "server/scheduler.h"

#include <algorithm>

namespace ballast::server {

void Scheduler::Enqueue(const std::string& job_id, int32_t priority, int64_t order, int32_t devices,
                        const std::string& kind) {
  Dequeue(job_id);
  QueueKey key{priority, order, job_id};
  queue_.emplace(key, Need{devices, kind});
  queued_keys_.emplace(job_id, std::move(key));
}

bool Scheduler::Dequeue(const std::string& job_id) {
  auto it = queued_keys_.find(job_id);
  if (it == queued_keys_.end()) return false;
  queue_.erase(it->second);
  queued_keys_.erase(it);
  return true;
}

void Scheduler::AddWorker(const std::string& worker_id, int32_t capacity, const std::string& kind) {
  Worker& w = workers_[worker_id];
  if (static_cast<int32_t>(w.busy.size()) != capacity) {
    w.busy.assign(std::max(capacity, 0), false);
    w.free = std::max(capacity, 0);
  }
  w.kind = kind;
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

std::vector<Decision> Scheduler::Schedule(
    const std::function<bool(const std::string& job_id, int32_t devices)>& admit) {
  std::vector<std::pair<const std::string*, Worker*>> by_position;
  by_position.reserve(workers_.size());
  std::map<std::string, Pool> pools;
  int64_t usable_free = 0;
  for (auto& [id, w] : workers_) {
    Pool& pool = pools[w.kind];
    pool.index.emplace_hint(pool.index.end(), w.free, static_cast<int32_t>(by_position.size()));
    pool.usable_free += w.free;
    by_position.emplace_back(&id, &w);
    usable_free += w.free;
  }
  auto capacity = [&](int32_t position) {
    return static_cast<int32_t>(by_position[position].second->busy.size());
  };
  bool reserved = false;
  std::vector<Decision> decisions;
  for (auto it = queue_.begin(); it != queue_.end() && usable_free > 0;) {
    const int32_t need = it->second.devices;
    const std::string& need_kind = it->second.kind;
    // Where it fits now: on one worker, the one with the fewest free that
    // suffice over every kind it may use; else spread over the kind with the
    // most free.
    Pool* fit_pool = nullptr;
    Index::iterator fit;
    Pool* spread_pool = nullptr;
    for (auto& [kind, pool] : pools) {
      if (!need_kind.empty() && kind != need_kind) continue;
      if (pool.usable_free < need) continue;
      // Position -1 sorts before every worker with the same free count.
      auto one = pool.index.lower_bound({need, -1});
      if (one != pool.index.end() && (fit_pool == nullptr || *one < *fit)) {
        fit_pool = &pool;
        fit = one;
      }
      if (spread_pool == nullptr || pool.usable_free > spread_pool->usable_free) {
        spread_pool = &pool;
      }
    }
    if (spread_pool == nullptr) {
      if (!reserved) {
        reserved = true;
        Reserve(it->second, capacity, &pools, &usable_free);
      }
      ++it;
      continue;
    }
    if (admit && !admit(it->first.job_id, need)) {
      ++it;
      continue;
    }
    Decision decision;
    decision.job_id = it->first.job_id;
    auto take = [&](Pool* pool, Index::iterator entry, int32_t count) {
      const int32_t position = entry->second;
      pool->index.erase(entry);
      auto [id, worker] = by_position[position];
      Take(*id, worker, count, &decision);
      pool->index.emplace(worker->free, position);
      pool->usable_free -= count;
    };
    if (fit_pool != nullptr) {
      take(fit_pool, fit, need);
    } else {
      for (int32_t left = need; left > 0;) {
        auto largest = std::prev(spread_pool->index.end());
        const int32_t count = std::min(left, largest->first);
        take(spread_pool, largest, count);
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

void Scheduler::Reserve(const Need& job, const std::function<int32_t(int32_t)>& capacity,
                        std::map<std::string, Pool>* pools, int64_t* usable_free) {
  const int32_t need = job.devices;
  auto may_use = [&](const std::string& kind) { return job.kind.empty() || kind == job.kind; };
  // The head's reservation, within one kind: one worker big enough, the one
  // nearest to free (most free now) over every kind; else, in the first kind
  // whose workers together are big enough, those with the most free until
  // their capacity suffices. Nothing is reserved for a job larger than every
  // kind's live workers together, which would otherwise block everything.
  Pool* pick_pool = nullptr;
  std::vector<Index::iterator> pick;
  for (auto& [kind, pool] : *pools) {
    if (!may_use(kind)) continue;
    for (auto w = pool.index.rbegin(); w != pool.index.rend(); ++w) {
      if (capacity(w->second) < need) continue;
      if (pick_pool == nullptr || pick.front()->first < w->first) {
        pick_pool = &pool;
        pick = {std::next(w).base()};
      }
      break;
    }
  }
  for (auto p = pools->begin(); p != pools->end() && pick_pool == nullptr; ++p) {
    if (!may_use(p->first)) continue;
    Pool& pool = p->second;
    int64_t total = 0;
    pick.clear();
    for (auto w = pool.index.rbegin(); w != pool.index.rend() && total < need; ++w) {
      pick.push_back(std::next(w).base());
      total += capacity(w->second);
    }
    if (total >= need) pick_pool = &pool;
  }
  if (pick_pool == nullptr) return;
  for (const Index::iterator& w : pick) {
    pick_pool->usable_free -= w->first;
    *usable_free -= w->first;
    pick_pool->index.erase(w);
  }
}

}  // namespace ballast::server
