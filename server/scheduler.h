// Gang scheduler: which queued jobs start now, and on which devices.
//
// Pure logic, no I/O and no clock: the coordinator mirrors its queue and its
// workers' devices into it and applies the decisions. Not thread-safe; the
// coordinator calls it under its own lock.
//
// Rules (docs/control-plane.md, "Scheduling"):
//  - A job needing N devices starts only when N are free at once, all of one
//    device kind: on one worker when one has N free (the one with the fewest
//    free that suffice, to keep large holes for large jobs), otherwise over
//    the workers of the kind with the most free devices, fewest workers
//    first.
//  - A job may name its device kind ("cuda", "cpu"); it then runs on workers
//    of that kind only. A job with none takes any kind.
//  - A hybrid-sharded job (sharding.shard_group G) takes its devices in
//    groups of G consecutive ranks, each group on one worker: it fits where
//    the workers' free devices, each rounded down to a multiple of G, add up
//    to N, and spreads over them in whole groups. Its ranks are numbered
//    group by group, so rank r's shard group r / G is on one worker.
//  - Higher priority first, then submission order.
//  - Backfill: when the first job in order does not fit, it reserves the
//    workers it would take as they free up; later jobs may use only devices
//    outside that reservation, so it cannot starve.
//  - Avoided devices: a job may name devices to avoid (those of its
//    stragglers in earlier attempts). On each worker chosen for it, its
//    other free devices are taken first, an avoided one only when the
//    worker has no other free. Avoiding never decides whether a job fits or
//    which workers it gets, so it never makes a job wait: a straggler's
//    slowness may be its rank's (its data, its shard) and not the device's,
//    and a job held back for a device that was merely slow would not train
//    at all.
//
// Cost: a pass costs O(log) per decision, per distinct need (devices, kind,
// group) in the queue, and per job `admit` refuses; never a walk of the
// whole queue or of every worker, except that a need of groups larger than
// one walks the workers with at least a group free to see whether it fits. Workers are kept indexed
// by free devices, and the queue by need as well as by order, so "the next job in order that fits
// in what is free" is one lookup per need. Placing a job walks the devices
// of the workers it gets (twice at most when it avoids some); its avoided
// devices, per job and few (its stragglers'), add O(log) each.
#ifndef BALLAST_SERVER_SCHEDULER_H_
#define BALLAST_SERVER_SCHEDULER_H_

#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ballast/v1/job.pb.h"

namespace ballast::server {

// One device of one worker.
struct Device {
  std::string worker_id;
  int32_t device = 0;
  auto operator<=>(const Device&) const = default;
};

// One job to start: its ranks in order (rank 0 first).
struct Decision {
  std::string job_id;
  std::vector<v1::RankPlacement> ranks;
};

class Scheduler {
 public:
  // Adds a job to the queue. `order` is its submission order (smaller first
  // among equal priorities); `kind` the device kind it must run on, empty
  // for any; `avoid` the devices it takes last on the workers it gets;
  // `group` the ranks that must share a worker (a hybrid job's shard group,
  // dividing `devices`; 1: any). Replaces an entry with the same id.
  void Enqueue(const std::string& job_id, int32_t priority, int64_t order, int32_t devices,
               const std::string& kind = "", std::set<Device> avoid = {}, int32_t group = 1);
  // Removes a queued job; false when it was not queued.
  bool Dequeue(const std::string& job_id);
  size_t queued() const { return queue_.size(); }

  // Adds a live worker with every device free, or revives a dead one keeping
  // no occupancy. A changed capacity replaces the old one. A gang only spans
  // workers of the same `kind` ("cuda", "cpu").
  void AddWorker(const std::string& worker_id, int32_t capacity, const std::string& kind = "cpu");
  // A dead worker offers nothing; its devices are forgotten.
  void RemoveWorker(const std::string& worker_id);
  // Marks a device busy (a re-adopted or placed rank). False when the worker
  // is unknown or dead, the device is out of range, or already busy.
  bool Occupy(const std::string& worker_id, int32_t device);
  // Marks a device free again; no effect when it is not busy.
  void Release(const std::string& worker_id, int32_t device);
  // Devices of live workers: busy and free.
  int64_t busy_devices() const;
  int64_t free_devices() const;

  // Starts every queued job that fits now, in order, honouring the head
  // job's reservation. The started jobs leave the queue and their devices
  // become busy. `admit`, when given, is asked about each job that fits,
  // just before it is placed: false leaves it queued without a reservation
  // (a tenant at its device quota must not hold devices from others).
  std::vector<Decision> Schedule(
      const std::function<bool(const std::string& job_id, int32_t devices)>& admit = nullptr);

 private:
  struct QueueKey {
    int32_t priority;
    int64_t order;
    std::string job_id;
    bool operator<(const QueueKey& o) const {
      if (priority != o.priority) return priority > o.priority;
      if (order != o.order) return order < o.order;
      return job_id < o.job_id;
    }
  };
  struct Need {
    int32_t devices;
    std::string kind;   // empty: any
    int32_t group = 1;  // ranks per worker-bound group
    auto operator<=>(const Need&) const = default;
  };
  struct Worker {
    std::vector<bool> busy;
    int32_t free = 0;
    std::string kind;
  };
  // Live workers as (free count, id), so ties break the same way every time.
  // The ids view the keys of workers_, which stay put.
  using Index = std::set<std::pair<int32_t, std::string_view>>;
  // The live workers of one device kind, minus, during a pass, those the
  // head job reserved.
  struct Pool {
    Index index;
    int64_t free = 0;
  };
  struct Queued {
    Need need;
    std::set<Device> avoid;
  };
  using Queue = std::map<QueueKey, Queued>;
  // Workers the head job reserved in this pass, out of their pools until the
  // pass ends.
  using Reservation = std::vector<std::pair<Pool*, Index::value_type>>;

  // Whether some pool the need may use has that many free devices (in whole
  // groups).
  bool Fits(const Need& need) const;
  // The free devices of `pool` in whole groups of `group` per worker.
  static int64_t FreeInGroups(const Pool& pool, int32_t group);
  // The first queued job after `after` (in order) that fits now.
  Queue::iterator NextFitting(const QueueKey& after);
  // Takes out of pools_ the workers the head job, which needs `need` and
  // does not fit now, waits for, if some kind it may run on can ever hold it.
  Reservation Reserve(const Need& need);
  // Takes the devices of a job that fits for `decision`.
  void Place(const Queued& job, Decision* decision);
  // Takes `count` free devices of one worker for `decision`, lowest first,
  // those in `avoid` after all others.
  void Take(std::string_view worker_id, int32_t count, const std::set<Device>& avoid,
            Decision* decision);
  void AddToPool(std::string_view worker_id, const Worker& worker);
  void RemoveFromPool(std::string_view worker_id, const Worker& worker);
  // Moves a worker's index entry to its new free count.
  void SetFree(std::string_view worker_id, Worker* worker, int32_t free);
  void Unqueue(Queue::iterator it);

  Queue queue_;
  std::map<std::string, QueueKey> queued_keys_;
  // The queue again, by what each job needs.
  std::map<Need, std::set<QueueKey>> by_need_;
  std::map<std::string, Worker, std::less<>> workers_;  // live workers only
  std::map<std::string, Pool> pools_;                   // by device kind
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_SCHEDULER_H_
