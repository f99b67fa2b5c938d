// WorkerTable: the registered workers, their leases and their assignment
// streams. It keeps the records; the coordinator decides what a worker's
// arrival or loss means for the scheduler and the jobs (MakeSchedulable,
// ReleaseLostRanks).
//
// Not thread-safe: the Coordinator holds it under its mutex
// (ABSL_GUARDED_BY there), as LevelDB's DBImpl holds its VersionSet.
#ifndef BALLAST_SERVER_WORKER_TABLE_H_
#define BALLAST_SERVER_WORKER_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/worker_service.pb.h"
#include "server/mailbox.h"
#include "server/store.h"

namespace ballast::server {

struct WorkerEntry {
  WorkerRecord record;
  // Lease end, in the coordinator's now_ms() time.
  int64_t deadline_ms = 0;
  // In the scheduler: registered or heartbeating since this process began.
  bool schedulable = false;
  // Assignments on their way to the worker's current stream.
  std::shared_ptr<Mailbox<v1::Assignment>> outbox;
};

class WorkerTable {
 public:
  // A lease lasts `lease_ms` from the last registration or heartbeat.
  explicit WorkerTable(int64_t lease_ms) : lease_ms_(lease_ms) {}

  // INVALID_ARGUMENT naming the field for a bad host, device_kind, capacity
  // or previous_worker_id.
  static absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request);

  // Adds the stored workers, each with a fresh lease from `now_ms`: a worker
  // that was alive gets one lease to come back.
  void Load(std::vector<WorkerRecord> workers, int64_t now_ms);

  // Records a (checked) registration as worker `id`, new or known: alive,
  // with the request's host and devices, heartbeat and a lease from `now_ms`.
  // Its outbox, if it had one, stays. Returns its entry.
  WorkerEntry& Register(const std::string& id, const v1::RegisterWorkerRequest& request,
                        int64_t now_ms);
  // A live worker's heartbeat at `now_ms`: its lease starts over.
  void Renew(WorkerEntry* worker, int64_t now_ms);
  // Marks the worker dead and no longer schedulable. Its stream ends (the
  // worker learns from NOT_FOUND that it must register); what is sent to it
  // from now on waits in a new outbox.
  void MarkDead(WorkerEntry* worker);

  // The worker, or nullptr when unknown.
  WorkerEntry* Find(const std::string& worker_id);
  const WorkerEntry* Find(const std::string& worker_id) const;
  // NOT_FOUND ("register again") when the worker is unknown or dead.
  absl::StatusOr<WorkerEntry*> Live(const std::string& worker_id);
  // Every worker, by id, dead ones included.
  const std::map<std::string, WorkerEntry>& all() const { return workers_; }
  int64_t alive() const;

  // What ExpireLeases does to one worker at a time.
  struct Lapse {
    std::string worker_id;
    // Alive, but its lease ended: it is to be marked dead.
    bool dies = false;
    // Dead (or dying now), with ranks (`with_ranks`), and its lease ended
    // more than `fence_ms` ago: its ranks are to be given up.
    bool loses_ranks = false;
  };
  // The deadline scan at `now_ms`: the workers with something to do, by id.
  std::vector<Lapse> Lapsed(int64_t now_ms, int64_t fence_ms,
                            const std::set<std::string>& with_ranks) const;

  // INVALID_ARGUMENT when `devices` is more than the live workers of any one
  // device kind (of `kind` alone when not empty) hold together, in whole
  // groups of `group` per worker (a hybrid job's shard groups), naming the
  // largest gang and the workers; OK when none is live.
  absl::Status CheckGangFits(int32_t devices, const std::string& kind, int32_t group = 1) const;

  // Ends every worker's stream (shutdown).
  void CloseAll();

 private:
  const int64_t lease_ms_;
  std::map<std::string, WorkerEntry> workers_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_WORKER_TABLE_H_
