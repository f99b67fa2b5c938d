// JobHistory: which finished jobs the coordinator keeps in memory, and how
// the rest leave it and the store.
//
// A finished job stays in memory (its series on /metrics) while it is among
// the newest `kept` finished jobs and finished less than `retention_ms` ago.
// Past either, it joins the jobs to evict: the coordinator writes each with
// JobRecord.evicted set and takes it out of memory once that write is stored,
// so that memory holds the live jobs and the recently finished ones however
// long the job history; the rest are read from the store. The store keeps
// the newest --job-history finished jobs and Prune deletes the others.
//
// Thread-safe, with a mutex of its own that it holds for no call outside
// itself: the coordinator calls it under its own mutex, and the store's
// writer thread (EvictionStored) without it.
#ifndef BALLAST_SERVER_JOB_HISTORY_H_
#define BALLAST_SERVER_JOB_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/job.pb.h"
#include "server/store.h"

namespace ballast::server {

class JobHistory {
 public:
  // `kept`: the newest finished jobs held in memory; `retention_ms`: how long
  // a finished job's series stay on /metrics.
  JobHistory(size_t kept, int64_t retention_ms) : kept_(kept), retention_ms_(retention_ms) {}

  // Loading from the store: `loaded` are the finished jobs in memory (id,
  // finish time) in any order, `evicted_by_state` counts those out of it.
  // The newest `kept` stay; the older ones are to be evicted.
  void Load(std::vector<std::pair<std::string, int64_t>> loaded,
            std::map<int, int64_t> evicted_by_state) ABSL_LOCKS_EXCLUDED(mu_);

  // The job finished at `finished_ms`; the oldest finished job is to be
  // evicted when this makes more than `kept`.
  void Finished(std::string job_id, int64_t finished_ms) ABSL_LOCKS_EXCLUDED(mu_);

  // Finished jobs more than retention_ms before `now_ms` are to be evicted,
  // oldest first. Returns whether any was.
  bool Expire(int64_t now_ms) ABSL_LOCKS_EXCLUDED(mu_);

  // The finished jobs whose series show at `now_ms`: those Expire(now_ms)
  // would keep.
  std::vector<std::string> Shown(int64_t now_ms) const ABSL_LOCKS_EXCLUDED(mu_);

  // --- Eviction ---
  // Takes the jobs to evict, oldest first.
  std::vector<std::string> TakeToEvict() ABSL_LOCKS_EXCLUDED(mu_);
  // Puts a job back among those to evict: its ranks still stop, or the store
  // failed to say evicted.
  void EvictLater(std::string job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // The store wrote (`stored`) or failed to write a record saying evicted.
  // Called from the store's writer thread.
  void EvictionStored(std::string job_id, bool stored) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes what EvictionStored heard since the last call, in its order.
  std::vector<std::pair<std::string, bool>> TakeStoredEvictions() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasStoredEvictions() const ABSL_LOCKS_EXCLUDED(mu_);
  // A job of `state` left memory.
  void Evicted(v1::JobState state) ABSL_LOCKS_EXCLUDED(mu_);
  // Jobs out of memory, by state (the int of v1::JobState), for ballast_jobs.
  std::map<int, int64_t> EvictedByState() const ABSL_LOCKS_EXCLUDED(mu_);

  // Deletes from `store` finished jobs beyond the newest `job_history` (those
  // in memory count first), `per_pass` at most. Returns how many it
  // deleted, or the store's error. Holds no lock while the store works.
  absl::StatusOr<int64_t> Prune(Store* store, int64_t job_history, int64_t per_pass)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void DropOldest() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t kept_;
  const int64_t retention_ms_;
  mutable absl::Mutex mu_;
  // (job id, when it finished), oldest first: the finished jobs in memory.
  std::deque<std::pair<std::string, int64_t>> recent_ ABSL_GUARDED_BY(mu_);
  // Finished jobs no longer among the recent ones, on their way out of memory.
  std::vector<std::string> to_evict_ ABSL_GUARDED_BY(mu_);
  // (job id, stored) of each evicted record a commit wrote.
  std::vector<std::pair<std::string, bool>> stored_evictions_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> evicted_by_state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_JOB_HISTORY_H_
