#include "server/worker_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/worker_id.h"

namespace ballast::server {

absl::Status WorkerTable::CheckRegistration(const v1::RegisterWorkerRequest& request) {
  if (request.host().empty()) {
    return absl::InvalidArgumentError("host: required, the address other nodes reach this one at");
  }
  if (request.device_kind() != "cuda" && request.device_kind() != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("device_kind: '", request.device_kind(), "'; allowed cuda or cpu"));
  }
  if (request.capacity() < 1 || request.capacity() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("capacity: ", request.capacity(), "; allowed 1..4096"));
  }
  if (!request.previous_worker_id().empty() && !IsWorkerId(request.previous_worker_id())) {
    return absl::InvalidArgumentError(
        "previous_worker_id: 1..128 characters of A-Z, a-z, 0-9, '.', '_' and '-'");
  }
  return absl::OkStatus();
}

void WorkerTable::Load(std::vector<WorkerRecord> workers, int64_t now_ms) {
  for (WorkerRecord& r : workers) {
    WorkerEntry& w = workers_[r.worker.id()];
    w.record = std::move(r);
    w.deadline_ms = now_ms + lease_ms_;
    w.outbox = std::make_shared<Mailbox<v1::Assignment>>();
  }
}

WorkerEntry& WorkerTable::Register(const std::string& id, const v1::RegisterWorkerRequest& request,
                                   int64_t now_ms) {
  WorkerEntry& w = workers_[id];
  if (w.outbox == nullptr) w.outbox = std::make_shared<Mailbox<v1::Assignment>>();
  v1::Worker& worker = w.record.worker;
  worker.set_id(id);
  worker.set_host(request.host());
  worker.set_device_kind(request.device_kind());
  worker.set_capacity(request.capacity());
  *worker.mutable_device_names() = request.device_names();
  worker.set_last_heartbeat_ms(now_ms);
  worker.set_alive(true);
  w.deadline_ms = now_ms + lease_ms_;
  return w;
}

void WorkerTable::Renew(WorkerEntry* worker, int64_t now_ms) {
  worker->record.worker.set_last_heartbeat_ms(now_ms);
  worker->deadline_ms = now_ms + lease_ms_;
}

void WorkerTable::MarkDead(WorkerEntry* worker) {
  worker->record.worker.set_alive(false);
  worker->schedulable = false;
  worker->outbox->Close();
  worker->outbox = std::make_shared<Mailbox<v1::Assignment>>();
}

WorkerEntry* WorkerTable::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerEntry* WorkerTable::Find(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

absl::StatusOr<WorkerEntry*> WorkerTable::Live(const std::string& worker_id) {
  WorkerEntry* w = Find(worker_id);
  if (w == nullptr || !w->record.worker.alive()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered; register again"));
  }
  return w;
}

int64_t WorkerTable::alive() const {
  int64_t alive = 0;
  for (const auto& [id, w] : workers_) alive += w.record.worker.alive() ? 1 : 0;
  return alive;
}

std::vector<WorkerTable::Lapse> WorkerTable::Lapsed(int64_t now_ms, int64_t fence_ms,
                                                    const std::set<std::string>& with_ranks) const {
  std::vector<Lapse> lapsed;
  for (const auto& [id, w] : workers_) {
    Lapse lapse{.worker_id = id};
    lapse.dies = w.record.worker.alive() && now_ms > w.deadline_ms;
    const bool dead = !w.record.worker.alive() || lapse.dies;
    lapse.loses_ranks = dead && with_ranks.count(id) > 0 && now_ms > w.deadline_ms + fence_ms;
    if (lapse.dies || lapse.loses_ranks) lapsed.push_back(std::move(lapse));
  }
  return lapsed;
}

absl::Status WorkerTable::CheckGangFits(int32_t devices, const std::string& kind,
                                        int32_t group) const {
  // Capacity of the live workers, per device kind: a gang is of one kind,
  // the job's own when it names one, and a shard group is on one worker.
  group = std::max(group, 1);
  std::map<std::string, int64_t> by_kind;
  std::vector<std::string> listed;
  for (const auto& [id, w] : workers_) {
    const v1::Worker& worker = w.record.worker;
    if (!worker.alive()) continue;
    if (kind.empty() || worker.device_kind() == kind) {
      by_kind[worker.device_kind()] += worker.capacity() / group * group;
    }
    listed.push_back(absl::StrCat(id, " ", worker.capacity(), " ", worker.device_kind()));
  }
  // With no live worker the cluster may still be starting up (workers and
  // ballastd launched together); the job waits in the queue for them, which
  // beats refusing the first submissions of every fresh cluster.
  if (listed.empty()) return absl::OkStatus();
  int64_t largest = 0;
  for (const auto& [k, capacity] : by_kind) largest = std::max(largest, capacity);
  if (devices <= largest) return absl::OkStatus();
  constexpr size_t kListed = 8;
  const size_t workers = listed.size();
  if (workers > kListed) {
    listed.resize(kListed);
    listed.push_back(absl::StrCat("and ", workers - kListed, " more"));
  }
  std::string what = kind.empty() ? absl::StrCat("devices ", devices)
                                  : absl::StrCat("devices ", devices, " with device ", kind);
  if (group > 1) {
    absl::StrAppend(&what, " in shard groups of sharding.shard_group ", group,
                    ", each on one worker");
  }
  const std::string of_kind = !kind.empty()        ? absl::StrCat(" of ", kind, " devices")
                              : by_kind.size() > 1 ? ", all of one device kind"
                                                   : "";
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": the largest gang this cluster can place is ", largest, of_kind, " (", workers,
      workers == 1 ? " worker: " : " workers: ", absl::StrJoin(listed, ", "), ")"));
}

void WorkerTable::CloseAll() {
  for (auto& [id, w] : workers_) w.outbox->Close();
}

}  // namespace ballast::server
