#include "server/scheduler.h"

#include <algorithm>

namespace ballast::server {

void Scheduler::Enqueue(const std::string& job_id, int32_t priority, int64_t order, int32_t devices,
                        const std::string& kind, std::set<Device> avoid, int32_t group) {
  Dequeue(job_id);
  QueueKey key{priority, order, job_id};
  Need need{devices, kind, std::max(group, 1)};
  by_need_[need].insert(key);
  queue_.emplace(key, Queued{std::move(need), std::move(avoid)});
  queued_keys_.emplace(job_id, std::move(key));
}

bool Scheduler::Dequeue(const std::string& job_id) {
  auto it = queued_keys_.find(job_id);
  if (it == queued_keys_.end()) return false;
  Unqueue(queue_.find(it->second));
  return true;
}

void Scheduler::Unqueue(Queue::iterator it) {
  auto bucket = by_need_.find(it->second.need);
  bucket->second.erase(it->first);
  if (bucket->second.empty()) by_need_.erase(bucket);
  queued_keys_.erase(it->first.job_id);
  queue_.erase(it);
}

void Scheduler::AddToPool(std::string_view worker_id, const Worker& worker) {
  Pool& pool = pools_[worker.kind];
  pool.index.emplace(worker.free, worker_id);
  pool.free += worker.free;
}

void Scheduler::RemoveFromPool(std::string_view worker_id, const Worker& worker) {
  auto pool = pools_.find(worker.kind);
  pool->second.index.erase({worker.free, worker_id});
  pool->second.free -= worker.free;
  if (pool->second.index.empty()) pools_.erase(pool);
}

void Scheduler::SetFree(std::string_view worker_id, Worker* worker, int32_t free) {
  Pool& pool = pools_.find(worker->kind)->second;
  pool.index.erase({worker->free, worker_id});
  pool.free += free - worker->free;
  worker->free = free;
  pool.index.emplace(free, worker_id);
}

void Scheduler::AddWorker(const std::string& worker_id, int32_t capacity, const std::string& kind) {
  auto [it, added] = workers_.try_emplace(worker_id);
  Worker& w = it->second;
  if (!added) RemoveFromPool(it->first, w);
  if (static_cast<int32_t>(w.busy.size()) != capacity) {
    w.busy.assign(std::max(capacity, 0), false);
    w.free = std::max(capacity, 0);
  }
  w.kind = kind;
  AddToPool(it->first, w);
}

void Scheduler::RemoveWorker(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  RemoveFromPool(it->first, it->second);
  workers_.erase(it);
}

bool Scheduler::Occupy(const std::string& worker_id, int32_t device) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || device < 0 ||
      device >= static_cast<int32_t>(it->second.busy.size()) || it->second.busy[device]) {
    return false;
  }
  it->second.busy[device] = true;
  SetFree(it->first, &it->second, it->second.free - 1);
  return true;
}

void Scheduler::Release(const std::string& worker_id, int32_t device) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || device < 0 ||
      device >= static_cast<int32_t>(it->second.busy.size()) || !it->second.busy[device]) {
    return;
  }
  it->second.busy[device] = false;
  SetFree(it->first, &it->second, it->second.free + 1);
}

int64_t Scheduler::busy_devices() const {
  int64_t busy = 0;
  for (const auto& [id, w] : workers_) busy += static_cast<int64_t>(w.busy.size()) - w.free;
  return busy;
}

int64_t Scheduler::free_devices() const {
  int64_t free = 0;
  for (const auto& [kind, pool] : pools_) free += pool.free;
  return free;
}

int64_t Scheduler::FreeInGroups(const Pool& pool, int32_t group) {
  if (group <= 1) return pool.free;
  int64_t free = 0;
  for (auto w = pool.index.lower_bound({group, std::string_view()}); w != pool.index.end(); ++w) {
    free += w->first / group * group;
  }
  return free;
}

bool Scheduler::Fits(const Need& need) const {
  auto fits = [&](const Pool& pool) {
    return pool.free >= need.devices && FreeInGroups(pool, need.group) >= need.devices;
  };
  if (!need.kind.empty()) {
    auto pool = pools_.find(need.kind);
    return pool != pools_.end() && fits(pool->second);
  }
  return std::any_of(pools_.begin(), pools_.end(),
                     [&](const auto& pool) { return fits(pool.second); });
}

Scheduler::Queue::iterator Scheduler::NextFitting(const QueueKey& after) {
  const QueueKey* next = nullptr;
  for (const auto& [need, keys] : by_need_) {
    if (!Fits(need)) continue;
    auto key = keys.upper_bound(after);
    if (key != keys.end() && (next == nullptr || *key < *next)) next = &*key;
  }
  return next == nullptr ? queue_.end() : queue_.find(*next);
}

void Scheduler::Take(std::string_view worker_id, int32_t count, const std::set<Device>& avoid,
                     Decision* decision) {
  Worker& w = workers_.find(worker_id)->second;
  const int32_t capacity = static_cast<int32_t>(w.busy.size());
  std::vector<bool> avoided(w.busy.size(), false);
  for (auto a = avoid.lower_bound(Device{std::string(worker_id), 0});
       a != avoid.end() && a->worker_id == worker_id; ++a) {
    if (a->device < capacity) avoided[a->device] = true;
  }
  int32_t taken = 0;
  // Avoided devices last. The worker was chosen by its free devices, avoided
  // ones included, so a job never waits for one it avoids (the header says
  // why).
  for (const bool take_avoided : {false, true}) {
    for (int32_t d = 0; d < capacity && taken < count; ++d) {
      if (w.busy[d] || avoided[d] != take_avoided) continue;
      w.busy[d] = true;
      ++taken;
      v1::RankPlacement& p = decision->ranks.emplace_back();
      p.set_rank(static_cast<int32_t>(decision->ranks.size()) - 1);
      p.set_worker_id(std::string(worker_id));
      p.set_device(d);
    }
  }
  SetFree(worker_id, &w, w.free - taken);
}

void Scheduler::Place(const Queued& job, Decision* decision) {
  const Need& need = job.need;
  // On one worker, the one with the fewest free that suffice over every kind
  // it may use; else spread over the kind with the most free.
  const Index::value_type* fit = nullptr;
  Pool* spread = nullptr;
  for (auto& [kind, pool] : pools_) {
    if ((!need.kind.empty() && kind != need.kind) || pool.free < need.devices) continue;
    // The empty id sorts before every worker with the same free count.
    auto one = pool.index.lower_bound({need.devices, std::string_view()});
    if (one != pool.index.end() && (fit == nullptr || *one < *fit)) fit = &*one;
    if (FreeInGroups(pool, need.group) < need.devices) continue;
    if (spread == nullptr || pool.free > spread->free) spread = &pool;
  }
  if (fit != nullptr) {
    Take(fit->second, need.devices, job.avoid, decision);
    return;
  }
  // Whole groups from the worker with the most free (each Take moves it
  // down the index); Fits() made sure they add up.
  for (int32_t left = need.devices; left > 0;) {
    const auto [free, worker_id] = *spread->index.rbegin();
    const int32_t count = std::min(left, free / need.group * need.group);
    if (count == 0) break;
    Take(worker_id, count, job.avoid, decision);
    left -= count;
  }
}

std::vector<Decision> Scheduler::Schedule(
    const std::function<bool(const std::string& job_id, int32_t devices)>& admit) {
  std::vector<Decision> decisions;
  bool reserved = false;
  Reservation reservation;
  for (auto it = queue_.begin(); it != queue_.end() && free_devices() > 0;) {
    const QueueKey key = it->first;
    const Need need = it->second.need;
    if (!Fits(need)) {
      // The first job in order that does not fit is the head: it reserves.
      if (!reserved) {
        reserved = true;
        reservation = Reserve(need);
      }
    } else if (!admit || admit(key.job_id, need.devices)) {
      Decision& decision = decisions.emplace_back();
      decision.job_id = key.job_id;
      Place(it->second, &decision);
      Unqueue(it);
    }
    // Once the head has reserved, only jobs that fit are worth a visit.
    it = reserved ? NextFitting(key) : queue_.upper_bound(key);
  }
  for (const auto& [pool, entry] : reservation) {
    pool->index.insert(entry);
    pool->free += entry.first;
  }
  return decisions;
}

Scheduler::Reservation Scheduler::Reserve(const Need& job) {
  const int32_t need = job.devices;
  auto may_use = [&](const std::string& kind) { return job.kind.empty() || kind == job.kind; };
  // What a worker can ever give the job: whole groups of it.
  auto capacity = [&](std::string_view worker_id) {
    const auto size = static_cast<int32_t>(workers_.find(worker_id)->second.busy.size());
    return size / job.group * job.group;
  };
  // The head's reservation, within one kind: one worker big enough, the one
  // nearest to free (most free now) over every kind; else, in the first kind
  // whose workers together are big enough, those with the most free until
  // their capacity suffices. Nothing is reserved for a job larger than every
  // kind's live workers together, which would otherwise block everything.
  Pool* pick_pool = nullptr;
  std::vector<Index::iterator> pick;
  for (auto& [kind, pool] : pools_) {
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
  for (auto p = pools_.begin(); p != pools_.end() && pick_pool == nullptr; ++p) {
    if (!may_use(p->first)) continue;
    Pool& pool = p->second;
    int64_t total = 0;
    pick.clear();
    for (auto w = pool.index.rbegin(); w != pool.index.rend() && total < need; ++w) {
      if (capacity(w->second) == 0) continue;  // smaller than one of its groups
      pick.push_back(std::next(w).base());
      total += capacity(w->second);
    }
    if (total >= need) pick_pool = &pool;
  }
  Reservation reservation;
  if (pick_pool == nullptr) return reservation;
  for (const Index::iterator& w : pick) {
    pick_pool->free -= w->first;
    reservation.emplace_back(pick_pool, *w);
    pick_pool->index.erase(w);
  }
  return reservation;
}

}  // namespace ballast::server
