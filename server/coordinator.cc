#include "server/coordinator.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/job_spec_files.h"
#include "common/job_spec_paths.h"
#include "common/rank_event_bound.h"
#include "prometheus/family.h"

namespace ballast::server {
namespace {

// Exit code given to OnRankGone for a rank whose worker went away.
constexpr int32_t kLost = -1;
// A rank exiting with this code says its spec or data is bad: no restart.
constexpr int32_t kExitBadSpec = 2;
// Histogram bounds, in seconds, of the time in the queue.
constexpr double kQueueSecondsBounds[] = {0.01, 0.1, 1, 10, 60, 600, 3600, 21600};

// A watcher further behind than this reads from the store instead.
constexpr size_t kWatchMailbox = 4096;

// Ids from the kernel's CSPRNG: a Mersenne Twister's outputs can be
// reconstructed from enough earlier ones, so a tenant watching its own job
// ids could learn the next ids of every other tenant's jobs.
std::string NewId(const char* prefix, int hex_digits) {
  std::string bytes((hex_digits + 1) / 2, '\0');
  for (size_t filled = 0; filled < bytes.size();) {
    const ssize_t n = getrandom(bytes.data() + filled, bytes.size() - filled, 0);
    if (n > 0) filled += n;
    // Blocks only until the pool is first seeded at boot; EINTR retries.
    if (n < 0 && errno != EINTR) {
      std::perror("ballastd: getrandom");
      std::abort();
    }
  }
  return prefix + absl::BytesToHexString(bytes).substr(0, hex_digits);
}

// The device kind a job must run on: the scheduler's kind, or empty for
// `device: auto`, which runs on any.
std::string DeviceKindOf(const v1::JobSpec& spec) {
  return spec.device() == "auto" ? "" : spec.device();
}

// The ranks that must share a worker: a hybrid job's shard group, else 1.
int32_t ShardGroupOf(const v1::JobSpec& spec) {
  return spec.sharding().strategy() == "hybrid" ? std::max(spec.sharding().shard_group(), 1) : 1;
}

// What a new attempt, placed as `ranks`, did with the devices of the job's
// stragglers in earlier attempts, each after "; ". The scheduler takes them
// last, so one is used only when its worker had no other free device.
std::string StragglerDevicesNote(
    const google::protobuf::RepeatedPtrField<v1::StragglerDevice>& straggler_devices,
    const std::vector<v1::RankPlacement>& ranks) {
  std::string note;
  for (const v1::StragglerDevice& device : straggler_devices) {
    const std::string straggler = absl::StrCat(
        "rank ", device.rank(), " was a straggler there in attempt ", device.attempt());
    const auto used = std::find_if(ranks.begin(), ranks.end(), [&](const v1::RankPlacement& p) {
      return p.worker_id() == device.worker_id() && p.device() == device.device();
    });
    if (used == ranks.end()) {
      absl::StrAppend(&note, "; avoids worker ", device.worker_id(), " device ", device.device(),
                      ": ", straggler);
    } else {
      absl::StrAppend(&note, "; rank ", used->rank(), " on worker ", device.worker_id(), " device ",
                      device.device(), " although ", straggler, ": ", device.worker_id(),
                      " had no other free device outside those avoided");
    }
  }
  return note;
}

int64_t RealNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ---------------------------------------------------------------------------
// AssignmentFeed

bool AssignmentFeed::Next(std::vector<v1::Assignment>* out, absl::Duration wait) {
  if (mailbox_->Take(out, wait) == Mailbox<v1::Assignment>::State::kClosed) return false;
  return coordinator_->FeedCurrent(worker_id_, mailbox_.get());
}

void AssignmentFeed::Return(std::vector<v1::Assignment> undelivered) {
  coordinator_->ReturnAssignments(worker_id_, std::move(undelivered));
}

// ---------------------------------------------------------------------------
// Set-up

Coordinator::Coordinator(Store* store, MetricsRegistry* metrics, CoordinatorOptions options)
    : store_(store),
      options_(std::move(options)),
      // A counter shows 0 from the start, so rate() and alerts see its first
      // drop.
      events_dropped_(prometheus::BuildCounter()
                          .Name("ballast_events_dropped_total")
                          .Help("Job events deleted by the per-job retention limit.")
                          .Register(metrics->registry())
                          .Add({})),
      jobs_pruned_(prometheus::BuildCounter()
                       .Name("ballast_jobs_pruned_total")
                       .Help("Finished jobs deleted from the store, with their events, beyond the "
                             "newest --job-history.")
                       .Register(metrics->registry())
                       .Add({})),
      queue_seconds_(
          prometheus::BuildHistogram()
              .Name("ballast_job_queue_seconds")
              .Help("Time from entering the queue (submission, requeue, rollback) to being "
                    "placed on workers.")
              .Register(metrics->registry())
              .Add({}, std::vector<double>(std::begin(kQueueSecondsBounds),
                                           std::end(kQueueSecondsBounds)))),
      scheduler_decision_seconds_(
          prometheus::BuildHistogram()
              .Name("ballast_scheduler_decision_seconds")
              .Help("Time of one scheduling pass over the queue.")
              .Register(metrics->registry())
              .Add({}, std::vector<double>{1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1})),
      workers_(options_.lease_ms),
      history_(options_.finished_jobs_kept, options_.metrics_retention_ms),
      job_metrics_(&mu_, &jobs_, &workers_, &scheduler_, &history_, options_.now_ms),
      // A random start: two coordinators on one host (a test beside another,
      // or a restart while old ranks still hold ports) rarely hand out the
      // same rendezvous port at the same time.
      port_counter_(std::random_device{}() % 1000),
      commits_(store, options_.event_retention, metrics) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(Store* store,
                                                                 MetricsRegistry* metrics,
                                                                 CoordinatorOptions options) {
  if (!options.now_ms) options.now_ms = RealNowMs;
  std::unique_ptr<Coordinator> c(new Coordinator(store, metrics, std::move(options)));
  if (absl::Status s = c->Load(); !s.ok()) return s;
  metrics->AddCollectable(&c->job_metrics_);
  c->lease_thread_ = std::thread([raw = c.get()] { raw->LeaseLoop(); });
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Load() {
  absl::StatusOr<std::vector<WorkerRecord>> workers = store_->LoadWorkers();
  if (!workers.ok()) return workers.status();
  absl::StatusOr<std::vector<JobRecord>> jobs = store_->LoadJobs();
  if (!jobs.ok()) return jobs.status();

  CommitQueue::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    workers_.Load(*std::move(workers), options_.now_ms());
    std::vector<std::pair<std::string, int64_t>> finished;
    for (JobRecord& r : *jobs) {
      const std::string id = r.job.id();
      last_order_ = std::max(last_order_, r.order);
      job_order_[r.order] = id;
      // Jobs stored before tenants belong to the default one.
      if (r.job.tenant().empty()) r.job.set_tenant(kDefaultTenant);
      if (!r.job.request_id().empty()) {
        request_ids_[ScopedRequestId(r.job.tenant(), r.job.request_id())] = id;
      }
      JobEntry& job = jobs_[id];
      job.record = std::move(r);
      job.fanout = std::make_shared<EventFanout>(job.record.job.last_seq());
      const v1::Job& j = job.record.job;
      if (j.state() == v1::JOB_STATE_QUEUED) {
        scheduler_.Enqueue(id, j.spec().scheduling().priority(), job.record.order,
                           j.spec().devices(), DeviceKindOf(j.spec()), {}, ShardGroupOf(j.spec()));
      }
      for (const v1::RankPlacement& p : j.placement()) {
        // A rank that exited before the restart stays exited.
        if (p.has_exit_code()) continue;
        live_ranks_[{id, job.record.attempt, p.rank()}] = Device{p.worker_id(), p.device()};
      }
      if (Terminal(j.state())) finished.emplace_back(id, j.updated_ms());
      if (j.state() == v1::JOB_STATE_QUEUED) {
        job.queued_since_ms = options_.now_ms();
        ++queued_by_tenant_[j.tenant()];
      }
    }
    absl::StatusOr<int64_t> last_order = store_->LastJobOrder();
    if (!last_order.ok()) return last_order.status();
    last_order_ = std::max(last_order_, *last_order);
    absl::StatusOr<std::map<int, int64_t>> evicted = store_->CountEvictedJobs();
    if (!evicted.ok()) return evicted.status();
    history_.Load(std::move(finished), *std::move(evicted));

    // Ranks on workers the store does not know can never report again, and a
    // job that was stopping with no rank left only has to finish stopping.
    std::vector<RankKey> orphaned;
    for (const auto& [key, device] : live_ranks_) {
      if (workers_.Find(device.worker_id) == nullptr) orphaned.push_back(key);
    }
    for (const RankKey& key : orphaned) {
      ReleaseRank(key);
      OnRankGone(&jobs_.at(std::get<0>(key)), std::get<2>(key), kLost,
                 absl::StrCat("rank ", std::get<2>(key), ": its worker is unknown"));
    }
    for (auto& [id, job] : jobs_) {
      const v1::JobState s = job.record.job.state();
      if ((s == v1::JOB_STATE_CANCELLING || s == v1::JOB_STATE_ROLLING_BACK) &&
          LiveRanks(job).empty()) {
        OnRankGone(&job, -1, kLost, "");
      }
    }
    ticket = Flush();
  }
  return Commit(ticket);
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    lease_wake_.SignalAll();
    for (auto& [id, job] : jobs_) job.fanout->CloseAll();
    workers_.CloseAll();
  }
  if (lease_thread_.joinable()) lease_thread_.join();
}

void Coordinator::LeaseLoop() {
  // Checking four times per lease bounds how late an expiry is noticed.
  const absl::Duration period =
      absl::Milliseconds(std::clamp<int64_t>(options_.lease_ms / 4, 10, 1000));
  absl::Time pruned = absl::Now();
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      lease_wake_.WaitWithTimeout(&mu_, period);
      if (shutting_down_) return;
    }
    ExpireLeases();
    WatchProgress();
    RetireFinishedJobs();
    if (options_.job_history > 0 && absl::Now() - pruned >= absl::Seconds(1)) {
      PruneHistory();
      pruned = absl::Now();
    }
  }
}

void Coordinator::PruneHistory() {
  if (options_.job_history <= 0) return;
  absl::StatusOr<int64_t> pruned = history_.Prune(store_, options_.job_history, kJobsPrunedPerPass);
  if (!pruned.ok()) {
    std::fprintf(stderr, "ballastd: pruning the job history failed: %s\n",
                 pruned.status().ToString().c_str());
    return;
  }
  if (*pruned > 0) jobs_pruned_.Increment(static_cast<double>(*pruned));
}

void Coordinator::RetireFinishedJobs() {
  CommitQueue::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    // Jobs past the retention are written evicted by this Flush; those whose
    // eviction is stored leave memory in the next one.
    const bool expired = history_.Expire(options_.now_ms());
    if (!expired && !history_.HasStoredEvictions()) return;
    ticket = Flush();
  }
  (void)Commit(ticket);
}

// ---------------------------------------------------------------------------
// Events and persistence

JobEntry* Coordinator::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

namespace {

// Another tenant's job answers exactly as a job that does not exist.
absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(
      absl::StrCat("job ", absl::CHexEscape(job_id.substr(0, 128)), " not found"));
}

}  // namespace

absl::StatusOr<JobEntry*> Coordinator::VisibleJob(const std::string& job_id,
                                                  const std::string& scope) {
  JobEntry* job = FindJob(job_id);
  if (job == nullptr || (!scope.empty() && job->record.job.tenant() != scope)) {
    return JobNotFound(job_id);
  }
  return job;
}

absl::StatusOr<JobRecord> Coordinator::EvictedJob(const std::string& job_id,
                                                  const std::string& scope) {
  absl::StatusOr<std::optional<JobRecord>> stored = store_->ReadJob(job_id);
  if (!stored.ok()) return stored.status();
  if (!stored->has_value() || (!scope.empty() && (*stored)->job.tenant() != scope)) {
    return JobNotFound(job_id);
  }
  return **std::move(stored);
}

void Coordinator::Touch(JobEntry* job) {
  job->record.job.set_updated_ms(options_.now_ms());
  WriteAgain(job);
}

void Coordinator::WriteAgain(JobEntry* job) {
  if (!job->dirty) {
    job->dirty = true;
    dirty_.push_back(job);
  }
}

void Coordinator::AddEvent(JobEntry* job, v1::JobEvent event) {
  v1::Job& j = job->record.job;
  j.set_last_seq(j.last_seq() + 1);
  // The store keeps the newest event_retention: this one pushes one out.
  if (j.last_seq() > options_.event_retention) {
    ++job->record.events_deleted;
    events_dropped_.Increment();
  }
  event.set_job_id(j.id());
  event.set_seq(j.last_seq());
  event.set_time_ms(options_.now_ms());
  event.set_attempt(job->record.attempt);
  job->unflushed.push_back(std::move(event));
  Touch(job);
}

void Coordinator::Transition(JobEntry* job, v1::JobState to, const std::string& reason) {
  v1::Job& j = job->record.job;
  v1::JobEvent e;
  e.mutable_state_change()->set_from(j.state());
  e.mutable_state_change()->set_to(to);
  e.mutable_state_change()->set_reason(reason);
  if (j.state() == v1::JOB_STATE_QUEUED) --queued_by_tenant_[j.tenant()];
  if (to == v1::JOB_STATE_QUEUED) ++queued_by_tenant_[j.tenant()];
  j.set_state(to);
  if (to == v1::JOB_STATE_QUEUED || Terminal(to)) j.clear_placement();
  if (Terminal(to)) history_.Finished(j.id(), options_.now_ms());
  if (to == v1::JOB_STATE_QUEUED) job->queued_since_ms = options_.now_ms();
  if (to == v1::JOB_STATE_SCHEDULED && job->queued_since_ms > 0) {
    queue_seconds_.Observe(static_cast<double>(options_.now_ms() - job->queued_since_ms) / 1000.0);
  }
  AddEvent(job, std::move(e));
}

void Coordinator::Evict() {
  for (const auto& [id, ok] : history_.TakeStoredEvictions()) {
    JobEntry* job = FindJob(id);
    if (job == nullptr || !job->record.evicted) continue;
    if (!ok) {
      // The store may not say evicted: write it again.
      job->record.evicted = false;
      history_.EvictLater(id);
      continue;
    }
    // A later write of it is still queued; its commit reports it again.
    if (job->dirty) continue;
    const v1::Job& j = job->record.job;
    if (!j.request_id().empty()) request_ids_.erase(ScopedRequestId(j.tenant(), j.request_id()));
    job_order_.erase(job->record.order);
    history_.Evicted(j.state());
    jobs_.erase(id);
  }
  for (const std::string& id : history_.TakeToEvict()) {
    JobEntry* job = FindJob(id);
    if (job == nullptr || job->record.evicted || !Terminal(job->record.job.state())) continue;
    // A finished job's ranks may still be stopping; it leaves once they are gone.
    if (HasLiveRanks(id)) {
      history_.EvictLater(id);
      continue;
    }
    job->record.evicted = true;
    WriteAgain(job);
  }
}

CommitQueue::Ticket Coordinator::Flush() {
  Evict();
  StoreBatch batch;
  // Beside batch.jobs, index for index.
  std::vector<std::shared_ptr<EventFanout>> fanouts;
  for (JobEntry* job : dirty_) {
    job->dirty = false;
    batch.jobs.push_back({job->record, std::exchange(job->unflushed, {})});
    fanouts.push_back(job->fanout);
  }
  dirty_.clear();
  batch.workers = std::exchange(unsaved_workers_, {});
  // Publishing in the writer, in queue order, keeps each job's events in seq
  // order across concurrent calls. When a write fails the events go out
  // anyway: in memory they happened, and a watcher's stream stays whole.
  return commits_.Queue(
      std::move(batch),
      [this, fanouts = std::move(fanouts)](const StoreBatch& written, const absl::Status& status) {
        for (size_t i = 0; i < fanouts.size(); ++i) fanouts[i]->Publish(written.jobs[i].events);
        // The next Flush takes evicted jobs out of memory once they are stored.
        for (const StoreBatch::JobChange& change : written.jobs) {
          if (change.record.evicted) history_.EvictionStored(change.record.job.id(), status.ok());
        }
      });
}

absl::Status Coordinator::Commit(CommitQueue::Ticket ticket) {
  absl::Status s = commits_.Wait(ticket);
  if (!s.ok()) std::fprintf(stderr, "ballastd: store write failed: %s\n", s.ToString().c_str());
  return s;
}

// ---------------------------------------------------------------------------
// Ranks and the state machine

std::vector<std::pair<Coordinator::RankKey, Device>> Coordinator::LiveRanks(
    const JobEntry& job) const {
  std::vector<std::pair<RankKey, Device>> out;
  const std::string& id = job.record.job.id();
  for (auto it = live_ranks_.lower_bound({id, job.record.attempt, 0});
       it != live_ranks_.end() && std::get<0>(it->first) == id &&
       std::get<1>(it->first) == job.record.attempt;
       ++it) {
    out.push_back(*it);
  }
  return out;
}

void Coordinator::Send(const std::string& worker_id, v1::Assignment assignment) {
  WorkerEntry* w = workers_.Find(worker_id);
  if (w != nullptr && w->record.worker.alive()) w->outbox->Push(std::move(assignment));
}

void Coordinator::SendStop(const RankKey& key, const std::string& worker_id) {
  v1::Assignment a;
  a.set_action(v1::Assignment::ACTION_STOP);
  a.set_job_id(std::get<0>(key));
  a.set_attempt(std::get<1>(key));
  a.set_rank(std::get<2>(key));
  a.set_grace_ms(options_.stop_grace_ms);
  Send(worker_id, std::move(a));
}

void Coordinator::StopRanks(const JobEntry& job) {
  for (const auto& [key, device] : LiveRanks(job)) SendStop(key, device.worker_id);
}

void Coordinator::ReleaseRank(const RankKey& key) {
  auto it = live_ranks_.find(key);
  if (it == live_ranks_.end()) return;
  scheduler_.Release(it->second.worker_id, it->second.device);
  live_ranks_.erase(it);
  if (JobEntry* job = FindJob(std::get<0>(key)); job != nullptr) EnqueueIfIdle(job);
}

bool Coordinator::HasLiveRanks(const std::string& job_id) const {
  auto it = live_ranks_.lower_bound({job_id, std::numeric_limits<int32_t>::min(), 0});
  return it != live_ranks_.end() && std::get<0>(it->first) == job_id;
}

void Coordinator::EnqueueIfIdle(JobEntry* job) {
  const v1::Job& j = job->record.job;
  if (j.state() != v1::JOB_STATE_QUEUED || HasLiveRanks(j.id())) return;
  std::set<Device> avoid;
  for (const v1::StragglerDevice& d : j.straggler_devices()) {
    avoid.insert(Device{d.worker_id(), d.device()});
  }
  scheduler_.Enqueue(j.id(), j.spec().scheduling().priority(), job->record.order,
                     j.spec().devices(), DeviceKindOf(j.spec()), std::move(avoid),
                     ShardGroupOf(j.spec()));
}

void Coordinator::Requeue(JobEntry* job, const std::string& reason) {
  Transition(job, v1::JOB_STATE_QUEUED, reason);
  // Ranks of the failed attempt that are still stopping hold the job back;
  // ReleaseRank queues it when the last one is gone.
  EnqueueIfIdle(job);
}

void Coordinator::FailAttempt(JobEntry* job, const std::string& reason, bool count_restart) {
  v1::Job& j = job->record.job;
  // The gang's other ranks cannot continue without this one.
  StopRanks(*job);
  j.set_failure_reason(reason);
  if (!count_restart) {
    Requeue(job, reason);
  } else if (j.restarts() < j.spec().scheduling().max_restarts()) {
    j.set_restarts(j.restarts() + 1);
    Requeue(job, absl::StrCat(reason, "; restart ", j.restarts(), " of ",
                              j.spec().scheduling().max_restarts(), " from the newest checkpoint"));
  } else {
    j.set_failure_reason(absl::StrCat(reason, "; restarts spent (max_restarts ",
                                      j.spec().scheduling().max_restarts(), ")"));
    Transition(job, v1::JOB_STATE_FAILED, j.failure_reason());
  }
}

void Coordinator::OnRankGone(JobEntry* job, int32_t rank, int32_t exit_code,
                             const std::string& why) {
  v1::Job& j = job->record.job;
  // Kept on the placement, which is stored, so ranks that finished before a
  // ballastd restart still count after it.
  for (v1::RankPlacement& p : *j.mutable_placement()) {
    if (p.rank() != rank) continue;
    p.set_exit_code(exit_code);
    Touch(job);
  }
  const bool none_live = LiveRanks(*job).empty();
  switch (j.state()) {
    case v1::JOB_STATE_CANCELLING:
      if (none_live) Transition(job, v1::JOB_STATE_CANCELLED, "cancelled; every rank stopped");
      return;
    case v1::JOB_STATE_ROLLING_BACK:
      if (none_live) {
        Requeue(job, absl::StrCat("rolling back; resumes at or before step ",
                                  job->record.resume_at_or_before.value_or(0)));
      }
      return;
    case v1::JOB_STATE_SCHEDULED:
    case v1::JOB_STATE_RUNNING:
      break;
    default:
      return;  // a leftover rank of a job already queued or finished
  }
  if (exit_code == 0) {
    if (std::all_of(j.placement().begin(), j.placement().end(), [](const v1::RankPlacement& p) {
          return p.has_exit_code() && p.exit_code() == 0;
        })) {
      j.set_failure_reason("");
      Transition(job, v1::JOB_STATE_SUCCEEDED, "every rank exited 0");
    }
    return;
  }
  if (exit_code == kExitBadSpec) {
    StopRanks(*job);
    j.set_failure_reason(why);
    Transition(job, v1::JOB_STATE_FAILED, why);
    return;
  }
  // A rank that never reported lost nothing: a worker that went away before
  // starting it does not use up the job's restarts.
  FailAttempt(job, why, j.state() == v1::JOB_STATE_RUNNING || exit_code != kLost);
}

void Coordinator::RunScheduler() {
  if (scheduler_.queued() == 0) return;
  const auto start = std::chrono::steady_clock::now();
  // Devices each tenant's live ranks hold, for the device quotas: counted
  // once a job with a quota fits, as most passes place nothing.
  std::optional<std::map<std::string, int64_t>> tenant_devices;
  std::vector<Decision> decisions =
      scheduler_.Schedule([&](const std::string& job_id, int32_t devices) {
        const std::string& tenant = jobs_.at(job_id).record.job.tenant();
        const int32_t quota = QuotaOf(tenant).max_devices;
        if (quota == 0) return true;
        if (!tenant_devices) {
          tenant_devices.emplace();
          for (const auto& [key, device] : live_ranks_) {
            if (const JobEntry* job = FindJob(std::get<0>(key))) {
              ++(*tenant_devices)[job->record.job.tenant()];
            }
          }
        }
        int64_t& used = (*tenant_devices)[tenant];
        if (used + devices > quota) return false;
        used += devices;
        return true;
      });
  scheduler_decision_seconds_.Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  for (Decision& d : decisions) {
    JobEntry* job = FindJob(d.job_id);
    if (job == nullptr) continue;
    v1::Job& j = job->record.job;
    JobRecord& r = job->record;
    r.attempt += 1;
    j.clear_placement();
    for (const v1::RankPlacement& p : d.ranks) *j.add_placement() = p;
    // The new attempt's straggler watch starts afresh.
    j.clear_straggler_ranks();
    const std::string& master = workers_.Find(d.ranks.front().worker_id())->record.worker.host();
    // Each attempt gets its own port, so a new gang never meets a half-dead
    // TCPStore of the previous one on the same host.
    const int32_t port = options_.master_port_base + static_cast<int32_t>(port_counter_++ % 1000);
    for (const v1::RankPlacement& p : d.ranks) {
      live_ranks_[{j.id(), r.attempt, p.rank()}] = Device{p.worker_id(), p.device()};
      v1::Assignment a;
      a.set_action(v1::Assignment::ACTION_START);
      a.set_job_id(j.id());
      a.set_attempt(r.attempt);
      a.set_rank(p.rank());
      a.set_world_size(static_cast<int32_t>(d.ranks.size()));
      a.set_device(p.device());
      *a.mutable_spec() = j.spec();
      a.set_output_dir(j.output_dir());
      a.set_master_addr(master);
      a.set_master_port(port);
      if (r.resume_at_or_before) a.set_resume_at_or_before(*r.resume_at_or_before);
      a.set_agent_silence_ms(options_.agent_silence_ms);
      for (const std::string& root : options_.path_roots) a.add_path_roots(root);
      Send(p.worker_id(), std::move(a));
    }
    Transition(job, v1::JOB_STATE_SCHEDULED,
               absl::StrCat("attempt ", r.attempt, " on ", d.ranks.size(), " device(s), rank 0 on ",
                            d.ranks.front().worker_id(),
                            StragglerDevicesNote(j.straggler_devices(), d.ranks)));
  }
}

// ---------------------------------------------------------------------------
// JobService

absl::StatusOr<v1::Job> Coordinator::SubmitJob(v1::JobSpec spec, const std::string& request_id,
                                               const std::string& tenant) {
  return WaitForReply<v1::Job>(
      [&](JobDone done) { SubmitJob(std::move(spec), request_id, tenant, std::move(done)); });
}

void Coordinator::SubmitJob(v1::JobSpec spec, const std::string& request_id,
                            const std::string& tenant, JobDone done) {
  if (request_id.size() > 128) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("request_id: ", request_id.size(), " characters; allowed at most 128")));
  }
  // Idempotency keys are per tenant: one tenant's key never returns another's job.
  const std::string request_key = ScopedRequestId(tenant, request_id);
  // A repeated submission returns its job once the job is surely stored: the
  // first call may still be writing it, or may have failed to. Writing it
  // again covers both.
  auto resubmitted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> JobEntry* {
    if (request_id.empty()) return nullptr;
    auto it = request_ids_.find(request_key);
    if (it == request_ids_.end()) return nullptr;
    JobEntry* job = &jobs_.at(it->second);
    WriteAgain(job);
    return job;
  };
  v1::Job submitted;
  CommitQueue::Ticket ticket = 0;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    if (JobEntry* job = resubmitted()) {
      known = true;
      submitted = job->record.job;
      ticket = Flush();
    }
  }
  if (known) return ReplyAfterCommit(ticket, std::move(submitted), std::move(done));
  absl::StatusOr<Admission> admitted = Admit(&spec, request_id.empty() ? "" : request_key, tenant);
  if (!admitted.ok()) return done(admitted.status());
  if (admitted->evicted) return done(*std::move(admitted->evicted));

  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      refused = absl::UnavailableError("ballastd is shutting down");
    } else if (const JobEntry* earlier = resubmitted()) {
      known = true;
      submitted = earlier->record.job;
    } else {
      refused = workers_.CheckGangFits(spec.devices(), DeviceKindOf(spec), ShardGroupOf(spec));
      if (refused.ok()) refused = CheckQuota(tenant, spec.devices());
    }
    if (!known && refused.ok()) {
      std::string id = std::move(admitted->id);
      // One a job in memory holds (submitted meanwhile, not yet stored) is
      // drawn again.
      while (jobs_.count(id) > 0) id = NewId("job-", 12);
      JobEntry& job = jobs_[id];
      job.fanout = std::make_shared<EventFanout>();
      JobRecord& record = job.record;
      record.order = ++last_order_;
      job_order_[record.order] = id;
      if (!request_id.empty()) request_ids_[request_key] = id;
      v1::Job& j = record.job;
      j.set_id(id);
      *j.mutable_spec() = std::move(spec);
      // The first event: from UNSPECIFIED (nothing) to QUEUED.
      j.set_state(v1::JOB_STATE_UNSPECIFIED);
      j.set_created_ms(options_.now_ms());
      j.set_output_dir((std::filesystem::path(options_.output_root) / id).string());
      j.set_request_id(request_id);
      j.set_tenant(tenant);
      Requeue(&job, "submitted");
      RunScheduler();
      submitted = j;
    }
    if (refused.ok()) ticket = Flush();
  }
  if (!refused.ok()) return done(refused);
  // Acknowledged only once stored: a crash right after the reply keeps it.
  ReplyAfterCommit(ticket, std::move(submitted), std::move(done));
}

absl::StatusOr<Coordinator::Admission> Coordinator::Admit(v1::JobSpec* spec,
                                                          const std::string& request_key,
                                                          const std::string& tenant) {
  Admission admission;
  // An evicted job was stored long ago; its key is only in the store.
  if (!request_key.empty()) {
    absl::StatusOr<std::optional<std::string>> id = store_->JobOfRequest(request_key);
    if (!id.ok()) return id.status();
    if (id->has_value()) {
      absl::StatusOr<JobRecord> stored = EvictedJob(**id, tenant);
      if (!stored.ok()) return stored.status();
      admission.evicted = std::move(stored->job);
      return admission;
    }
  }
  // The output root holds every tenant's results: a spec may read only its
  // own tenant's job folders there (a job trained from an earlier export).
  // Checked before any file is read, so that no answer tells whether
  // another tenant's folder holds a model.
  if (absl::Status s = CheckPathsOutsideOtherJobs(*spec, options_.output_root,
                                                  [&](const std::string& folder) {
                                                    return folder == TenantUploadFolder(tenant) ||
                                                           IsJobOfTenant(folder, tenant);
                                                  });
      !s.ok()) {
    return s;
  }
  // Validation reads the model's config.json: outside the lock.
  if (absl::Status s = PrepareJobSpec(spec, options_.path_roots); !s.ok()) return s;
  // Evicted jobs keep their ids, so a new id must be new to the store too.
  for (bool stored = true; stored;) {
    admission.id = NewId("job-", 12);
    absl::StatusOr<std::optional<JobRecord>> found = store_->ReadJob(admission.id);
    if (!found.ok()) return found.status();
    stored = found->has_value();
  }
  return admission;
}

bool Coordinator::IsJobOfTenant(const std::string& job_id, const std::string& tenant) {
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it != jobs_.end()) return it->second.record.job.tenant() == tenant;
  }
  // Evicted from memory (finished long ago), perhaps still stored.
  absl::StatusOr<std::optional<JobRecord>> stored = store_->ReadJob(job_id);
  return stored.ok() && stored->has_value() && (*stored)->job.tenant() == tenant;
}

void Coordinator::LogStoreWriteFailure(const absl::Status& status) {
  std::fprintf(stderr, "ballastd: store write failed: %s\n", status.ToString().c_str());
}

const TenantQuota& Coordinator::QuotaOf(const std::string& tenant) const {
  auto it = options_.quotas.find(tenant);
  return it == options_.quotas.end() ? options_.default_quota : it->second;
}

absl::Status Coordinator::CheckQuota(const std::string& tenant, int32_t devices) const {
  const TenantQuota& quota = QuotaOf(tenant);
  if (quota.max_devices > 0 && devices > quota.max_devices) {
    return absl::ResourceExhaustedError(
        absl::StrCat("devices ", devices, ": tenant ", tenant, "'s quota max_devices is ",
                     quota.max_devices, ", so this job could never start (ballastd --quota)"));
  }
  if (quota.max_queued_jobs > 0) {
    auto it = queued_by_tenant_.find(tenant);
    const int64_t queued = it == queued_by_tenant_.end() ? 0 : it->second;
    if (queued >= quota.max_queued_jobs) {
      return absl::ResourceExhaustedError(
          absl::StrCat("tenant ", tenant, " has ", queued,
                       " queued jobs, its quota max_queued_jobs (ballastd "
                       "--quota): wait for some to start, or cancel some"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& job_id, const std::string& scope) {
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> visible = VisibleJob(job_id, scope);
    if (visible.ok()) return (*visible)->record.job;
  }
  absl::StatusOr<JobRecord> stored = EvictedJob(job_id, scope);
  if (!stored.ok()) return stored.status();
  return stored->job;
}

absl::StatusOr<std::vector<Coordinator::RankStats>> Coordinator::JobRankStats(
    const std::string& job_id, const std::string& scope) {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<JobEntry*> visible = VisibleJob(job_id, scope);
  if (!visible.ok()) {
    // The series of an evicted job left with it (they are since ballastd started).
    absl::StatusOr<JobRecord> stored = EvictedJob(job_id, scope);
    if (!stored.ok()) return stored.status();
    return std::vector<RankStats>();
  }
  JobEntry* job = *visible;
  std::vector<RankStats> stats;
  for (const auto& [rank, series] : job->ranks) {
    const prometheus::ClientMetric::Histogram steps = series.step_seconds.Collect().histogram;
    stats.push_back({.rank = rank,
                     .steps = steps.sample_count,
                     .step_seconds = steps.sample_sum,
                     .peak_memory_bytes = series.peak_memory_bytes,
                     .communicated_bytes = series.communicated_bytes,
                     .replica_communicated_bytes = series.replica_communicated_bytes,
                     .collective_wait_seconds = series.collective_wait_seconds});
  }
  return stats;
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                           const std::string& scope) {
  if (request.page_size() < 0 || request.page_size() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: ", request.page_size(), "; allowed 1..1000, 0 means 100"));
  }
  const int page_size = request.page_size() == 0 ? 100 : request.page_size();
  int64_t before = std::numeric_limits<int64_t>::max();
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &before) || before <= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_token: '", request.page_token(),
                     "' is not a token from ListJobs; pass next_page_token as returned"));
  }
  const std::set<int> states(request.states().begin(), request.states().end());
  const size_t candidates = static_cast<size_t>(page_size) + 1;
  // The newest jobs in memory, up to one past a page: the page takes at most
  // page_size of them, and the next tells whether more follow.
  std::vector<std::pair<int64_t, v1::Job>> resident;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = std::make_reverse_iterator(job_order_.lower_bound(before));
         it != job_order_.rend() && resident.size() < candidates; ++it) {
      const v1::Job& j = jobs_.at(it->second).record.job;
      if (!states.empty() && states.count(j.state()) == 0) continue;
      if (!scope.empty() && j.tenant() != scope) continue;
      resident.emplace_back(it->first, j);
    }
  }
  // Evicted jobs are finished ones, read from the store without the lock. A
  // job evicted since the copy above is in both: the memory copy counts.
  std::vector<JobRecord> evicted;
  if (states.empty() || std::any_of(states.begin(), states.end(), [](int state) {
        return Terminal(static_cast<v1::JobState>(state));
      })) {
    absl::StatusOr<std::vector<JobRecord>> stored = store_->ListEvictedJobs(
        before, states, scope, static_cast<int>(candidates + resident.size()));
    if (!stored.ok()) return stored.status();
    std::set<std::string> copied;
    for (const auto& [order, j] : resident) copied.insert(j.id());
    for (JobRecord& r : *stored) {
      if (copied.count(r.job.id()) == 0) evicted.push_back(std::move(r));
    }
  }

  v1::ListJobsResponse response;
  // A page also ends at list_page_bytes (with at least one job in it).
  size_t bytes = 0;
  int64_t last_order = 0;
  auto next = resident.begin();
  auto next_evicted = evicted.begin();
  while (next != resident.end() || next_evicted != evicted.end()) {
    const bool from_memory = next_evicted == evicted.end() ||
                             (next != resident.end() && next->first > next_evicted->order);
    const v1::Job& j = from_memory ? next->second : next_evicted->job;
    const size_t size = j.ByteSizeLong();
    if (response.jobs_size() == page_size ||
        (response.jobs_size() > 0 && bytes + size > options_.list_page_bytes)) {
      response.set_next_page_token(absl::StrCat(last_order));
      break;
    }
    bytes += size;
    *response.add_jobs() = j;
    last_order = from_memory ? (next++)->first : (next_evicted++)->order;
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& job_id,
                                               const std::string& scope) {
  CommitQueue::Ticket ticket;
  v1::Job cancelled;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<JobEntry*> visible = VisibleJob(job_id, scope);
    if (!visible.ok()) {
      // Only finished jobs leave memory: cancelling one changes nothing.
      absl::StatusOr<JobRecord> stored = EvictedJob(job_id, scope);
      if (!stored.ok()) return stored.status();
      return stored->job;
    }
    JobEntry* job = *visible;
    const v1::JobState state = job->record.job.state();
    if (Terminal(state) || state == v1::JOB_STATE_CANCELLING) return job->record.job;
    if (state == v1::JOB_STATE_QUEUED) {
      scheduler_.Dequeue(job_id);
      Transition(job, v1::JOB_STATE_CANCELLED, "cancelled while queued");
    } else if (LiveRanks(*job).empty()) {
      Transition(job, v1::JOB_STATE_CANCELLED, "cancelled; no rank was running");
    } else {
      StopRanks(*job);
      Transition(job, v1::JOB_STATE_CANCELLING, "cancel requested; stopping ranks");
    }
    // Copied first: a Flush may take finished jobs out of memory.
    cancelled = job->record.job;
    ticket = Flush();
  }
  return AfterCommit(ticket, std::move(cancelled));
}

absl::StatusOr<v1::Job> Coordinator::RollbackJob(const std::string& job_id, int64_t to_step,
                                                 const std::string& scope) {
  CommitQueue::Ticket ticket;
  v1::Job rolling_back;
  {
    absl::MutexLock lock(&mu_);
    auto not_live = [&](v1::JobState state) {
      return absl::FailedPreconditionError(absl::StrCat("job ", job_id, " is ", StateName(state),
                                                        "; only a live job can roll back"));
    };
    absl::StatusOr<JobEntry*> visible = VisibleJob(job_id, scope);
    if (!visible.ok()) {
      absl::StatusOr<JobRecord> stored = EvictedJob(job_id, scope);
      if (!stored.ok()) return stored.status();
      return not_live(stored->job.state());
    }
    JobEntry* job = *visible;
    v1::Job& j = job->record.job;
    if (Terminal(j.state()) || j.state() == v1::JOB_STATE_CANCELLING) return not_live(j.state());
    if (to_step < 0 || to_step > j.step()) {
      return absl::InvalidArgumentError(
          absl::StrCat("to_step: ", to_step, "; allowed 0..", j.step(),
                       " (the current step; 0 starts over from the initial weights)"));
    }
    job->record.resume_at_or_before = to_step;
    switch (j.state()) {
      case v1::JOB_STATE_QUEUED:
      case v1::JOB_STATE_ROLLING_BACK:
        Touch(job);  // the next attempt picks up the new step
        break;
      default:
        if (LiveRanks(*job).empty()) {
          Requeue(job, absl::StrCat("rolling back; resumes at or before step ", to_step));
        } else {
          StopRanks(*job);
          Transition(job, v1::JOB_STATE_ROLLING_BACK,
                     absl::StrCat("rollback to step ", to_step, " requested; stopping ranks"));
        }
    }
    RunScheduler();
    rolling_back = j;
    ticket = Flush();
  }
  return AfterCommit(ticket, std::move(rolling_back));
}

absl::StatusOr<std::unique_ptr<EventWatch>> Coordinator::WatchJob(const std::string& job_id,
                                                                  int64_t after_seq,
                                                                  const std::string& scope) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("ballastd is shutting down");
  after_seq = std::max<int64_t>(after_seq, 0);
  absl::StatusOr<JobEntry*> visible = VisibleJob(job_id, scope);
  std::shared_ptr<EventFanout> fanout;
  v1::Job j;
  if (visible.ok()) {
    fanout = (*visible)->fanout;
    j = (*visible)->record.job;
  } else {
    // An evicted job's events are all stored: a fanout of its own that
    // nothing publishes to replays them and ends at the terminal one.
    absl::StatusOr<JobRecord> stored = EvictedJob(job_id, scope);
    if (!stored.ok()) return stored.status();
    j = std::move(stored->job);
    fanout = std::make_shared<EventFanout>(j.last_seq());
  }
  // A terminal job has nothing after its last event.
  const bool seen_all = Terminal(j.state()) && after_seq >= j.last_seq();
  return std::unique_ptr<EventWatch>(
      new EventWatch(store_, job_id, after_seq, seen_all, fanout, fanout->Join(kWatchMailbox)));
}

std::vector<v1::Worker> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::map<std::string, int32_t> busy;
  for (const auto& [key, device] : live_ranks_) ++busy[device.worker_id];
  std::vector<v1::Worker> out;
  for (const auto& [id, w] : workers_.all()) {
    v1::Worker& worker = out.emplace_back(w.record.worker);
    worker.set_busy(w.record.worker.alive() ? busy[id] : 0);
  }
  return out;
}

// ---------------------------------------------------------------------------
// WorkerService

void Coordinator::PutWorker(const WorkerEntry& worker) {
  unsaved_workers_.push_back(worker.record);
}

void Coordinator::MakeSchedulable(WorkerEntry* worker) {
  const std::string& id = worker->record.worker.id();
  scheduler_.RemoveWorker(id);
  scheduler_.AddWorker(id, worker->record.worker.capacity(), worker->record.worker.device_kind());
  for (const auto& [key, device] : live_ranks_) {
    if (device.worker_id == id) scheduler_.Occupy(id, device.device);
  }
  worker->schedulable = true;
}

void Coordinator::MarkDead(WorkerEntry* worker) {
  workers_.MarkDead(worker);
  scheduler_.RemoveWorker(worker->record.worker.id());
  PutWorker(*worker);
}

bool Coordinator::ReleaseLostRanks(const WorkerEntry& worker, const std::string& reason) {
  const std::string& id = worker.record.worker.id();
  std::vector<RankKey> lost;
  for (const auto& [key, device] : live_ranks_) {
    if (device.worker_id == id) lost.push_back(key);
  }
  for (const RankKey& key : lost) {
    ReleaseRank(key);
    JobEntry* job = FindJob(std::get<0>(key));
    if (job != nullptr && job->record.attempt == std::get<1>(key)) {
      OnRankGone(job, std::get<2>(key), kLost,
                 absl::StrCat("rank ", std::get<2>(key), ": worker ", id, " ", reason));
    }
  }
  return !lost.empty();
}

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const std::string& bound_worker_id) {
  if (absl::Status s = WorkerTable::CheckRegistration(request); !s.ok()) return s;
  CommitQueue::Ticket ticket;
  v1::RegisterWorkerResponse response;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("ballastd is shutting down");
    // A worker token's id wins over the id the worker remembers: the token is
    // who it is, and what it remembers is only a hint (ranks of another id it
    // still runs are stopped below as stale).
    std::string id = bound_worker_id.empty() ? request.previous_worker_id() : bound_worker_id;
    if (id.empty()) {
      do {
        id = NewId("worker-", 12);
      } while (workers_.Find(id) != nullptr);
    }
    WorkerEntry& w = workers_.Register(id, request, options_.now_ms());

    // Re-adoption: the ranks it still runs that are ours stay; ours it no
    // longer runs are gone; anything else it runs is stale and is stopped.
    std::set<RankKey> running;
    for (const v1::RankRef& r : request.running()) {
      RankKey key{r.job_id(), r.attempt(), r.rank()};
      auto it = live_ranks_.find(key);
      if (it == live_ranks_.end() || it->second.worker_id != id) {
        SendStop(key, id);
        continue;
      }
      running.insert(key);
      JobEntry* job = FindJob(r.job_id());
      // A stop sent before the restart may have been lost with the stream.
      if (job == nullptr || job->record.attempt != r.attempt() ||
          job->record.job.state() == v1::JOB_STATE_CANCELLING ||
          job->record.job.state() == v1::JOB_STATE_ROLLING_BACK ||
          Terminal(job->record.job.state())) {
        SendStop(key, id);
      }
    }
    std::vector<RankKey> gone;
    for (const auto& [key, device] : live_ranks_) {
      if (device.worker_id == id && running.count(key) == 0) gone.push_back(key);
    }
    for (const RankKey& key : gone) {
      ReleaseRank(key);
      JobEntry* job = FindJob(std::get<0>(key));
      if (job != nullptr && job->record.attempt == std::get<1>(key)) {
        OnRankGone(
            job, std::get<2>(key), kLost,
            absl::StrCat("rank ", std::get<2>(key), ": worker ", id, " re-registered without it"));
      }
    }
    MakeSchedulable(&w);
    PutWorker(w);
    RunScheduler();
    ticket = Flush();
    response.set_worker_id(id);
  }
  response.set_lease_ms(options_.lease_ms);
  response.set_heartbeat_interval_ms(options_.lease_ms / 3);
  return AfterCommit(ticket, std::move(response));
}

absl::StatusOr<v1::HeartbeatResponse> Coordinator::Heartbeat(const v1::HeartbeatRequest& request) {
  CommitQueue::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<WorkerEntry*> live = workers_.Live(request.worker_id());
    if (!live.ok()) return live.status();
    WorkerEntry& w = **live;
    workers_.Renew(&w, options_.now_ms());
    // After a coordinator restart a worker that just keeps heartbeating has
    // proven it is alive: its devices count again.
    if (!w.schedulable) MakeSchedulable(&w);
    for (const v1::RankRef& r : request.running()) {
      RankKey key{r.job_id(), r.attempt(), r.rank()};
      auto live = live_ranks_.find(key);
      if (live == live_ranks_.end() || live->second.worker_id != request.worker_id()) {
        SendStop(key, request.worker_id());
      }
    }
    RunScheduler();
    ticket = Flush();
  }
  v1::HeartbeatResponse response;
  response.set_lease_ms(options_.lease_ms);
  return AfterCommit(ticket, std::move(response));
}

absl::StatusOr<std::unique_ptr<AssignmentFeed>> Coordinator::StreamAssignments(
    const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("ballastd is shutting down");
  absl::StatusOr<WorkerEntry*> live = workers_.Live(worker_id);
  if (!live.ok()) return live.status();
  WorkerEntry& w = **live;
  auto mailbox = std::make_shared<Mailbox<v1::Assignment>>();
  for (v1::Assignment& a : w.outbox->Close()) mailbox->Push(std::move(a));
  w.outbox = mailbox;
  return std::unique_ptr<AssignmentFeed>(new AssignmentFeed(this, worker_id, mailbox));
}

bool Coordinator::FeedCurrent(const std::string& worker_id,
                              const Mailbox<v1::Assignment>* mailbox) {
  absl::MutexLock lock(&mu_);
  const WorkerEntry* w = workers_.Find(worker_id);
  return !shutting_down_ && w != nullptr && w->outbox.get() == mailbox;
}

void Coordinator::ReturnAssignments(const std::string& worker_id,
                                    std::vector<v1::Assignment> undelivered) {
  absl::MutexLock lock(&mu_);
  WorkerEntry* w = workers_.Find(worker_id);
  if (w == nullptr) return;
  for (auto a = undelivered.rbegin(); a != undelivered.rend(); ++a) {
    w->outbox->PushFront(std::move(*a));
  }
}

void Coordinator::ApplyRankEvent(const std::string& worker_id, const v1::RankEvent& e) {
  JobEntry* job = FindJob(e.job_id());
  const RankKey key{e.job_id(), e.attempt(), e.rank()};
  auto live = live_ranks_.find(key);
  if (job == nullptr || live == live_ranks_.end() || live->second.worker_id != worker_id) return;
  if (e.has_exited()) ReleaseRank(key);
  // Events of an older attempt only free their device, and a finished job's
  // stream already ended with its terminal state change.
  v1::Job& j = job->record.job;
  if (e.attempt() != job->record.attempt || Terminal(j.state())) return;
  if (j.state() == v1::JOB_STATE_SCHEDULED) {
    Transition(job, v1::JOB_STATE_RUNNING,
               absl::StrCat("rank ", e.rank(), " started on worker ", worker_id));
  }
  switch (e.kind_case()) {
    case v1::RankEvent::kTraining: {
      job->watch.Observe(e.attempt(), e.rank(), e.training(), options_.now_ms());
      // A phase is the watchdog's input, kept in memory until a stall
      // reports it: a job of long steps holds phases often, and stored they
      // would crowd its step metrics out of the event history.
      if (e.training().has_phase()) return;
      if (!ApplyTrainingEvent(job, e.rank(), e.training())) return;
      v1::JobEvent out;
      *out.mutable_training() = e.training();
      AddEvent(job, std::move(out));
      return;
    }
    case v1::RankEvent::kExited: {
      const v1::RankExited& x = e.exited();
      std::string why = absl::StrCat("rank ", e.rank(), " exited with code ", x.exit_code());
      const std::string& tail = x.stderr_tail();
      const size_t end = tail.find_last_not_of("\n ");
      if (end != std::string::npos) {
        const size_t begin = tail.rfind('\n', end);
        absl::StrAppend(&why, ": ",
                        tail.substr(begin == std::string::npos ? 0 : begin + 1,
                                    end - (begin == std::string::npos ? 0 : begin + 1) + 1));
      }
      OnRankGone(job, e.rank(), x.exit_code(), why);
      return;
    }
    case v1::RankEvent::kStarted:
    case v1::RankEvent::KIND_NOT_SET:
      return;
  }
}

absl::StatusOr<v1::ReportEventsResponse> Coordinator::ReportEvents(
    const v1::ReportEventsRequest& request) {
  return WaitForReply<v1::ReportEventsResponse>(
      [&](ReportDone done) { ReportEvents(request, std::move(done)); });
}

void Coordinator::ReportEvents(const v1::ReportEventsRequest& request, ReportDone done) {
  CommitQueue::Ticket ticket = 0;
  v1::ReportEventsResponse response;
  absl::Status refused;
  {
    absl::MutexLock lock(&mu_);
    refused = ApplyReport(request, &response, &ticket);
  }
  // Without the lock: `done` finishes the RPC, which counts it in the
  // metrics, whose collection takes the lock.
  if (!refused.ok()) return done(refused);
  // Acknowledged only once stored: the worker forgets what it sent.
  ReplyAfterCommit<v1::ReportEventsResponse>(ticket, std::move(response), std::move(done));
}

absl::Status Coordinator::ApplyReport(const v1::ReportEventsRequest& request,
                                      v1::ReportEventsResponse* response,
                                      CommitQueue::Ticket* ticket) {
  absl::StatusOr<WorkerEntry*> live = workers_.Live(request.worker_id());
  if (!live.ok()) return live.status();
  WorkerEntry& w = **live;
  // A worker numbers its reports from its start time in microseconds, one
  // by one: a report_id a day past now is no worker's (and would make every
  // real report after it look seen before).
  const int64_t horizon = (options_.now_ms() + kReportIdHorizonMs) * 1000;
  if (request.report_id() <= 0 || request.report_id() > horizon) {
    return absl::InvalidArgumentError(
        absl::StrCat("report_id: ", request.report_id(),
                     "; a worker's report ids count up from its start "
                     "time in microseconds, so allowed 1..",
                     horizon));
  }
  response->set_acked_report_id(request.report_id());
  // At least once on the wire, at most once here. A report seen before may
  // still be on its way to the store (its first delivery timed out): the
  // worker's record, written again behind it, is stored only after it.
  if (request.report_id() > w.record.last_report_id) {
    for (v1::RankEvent e : request.events()) {
      BoundRankEvent(&e);  // a worker's own bound is not to be trusted
      ApplyRankEvent(request.worker_id(), e);
    }
    w.record.last_report_id = request.report_id();
    RunScheduler();
  }
  // In the same transaction as the report's events, so a resent report is
  // applied exactly once even across a crash.
  PutWorker(w);
  *ticket = Flush();
  return absl::OkStatus();
}

void Coordinator::ExpireLeases() {
  CommitQueue::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    const int64_t now = options_.now_ms();
    // A lost worker's ranks may still run (a frozen agent, a cut network) until
    // they notice their agent's silence and fence themselves.
    const int64_t fence_ms =
        options_.agent_silence_ms > 0 ? options_.agent_silence_ms + kFenceMarginMs : 0;
    std::set<std::string> with_ranks;
    for (const auto& [key, device] : live_ranks_) with_ranks.insert(device.worker_id);
    bool changed = false;
    for (const WorkerTable::Lapse& lapse : workers_.Lapsed(now, fence_ms, with_ranks)) {
      WorkerEntry& w = *workers_.Find(lapse.worker_id);
      if (lapse.dies) {
        MarkDead(&w);
        changed = true;
      }
      if (lapse.loses_ranks) {
        changed |= ReleaseLostRanks(
            w, absl::StrCat(
                   "lost its lease (", options_.lease_ms, " ms without a heartbeat",
                   fence_ms > 0 ? absl::StrCat("; its ranks fenced after ", fence_ms, " ms") : "",
                   ")"));
      }
    }
    if (!changed) return;
    RunScheduler();
    ticket = Flush();
  }
  (void)Commit(ticket);
}

void Coordinator::WatchProgress() {
  CommitQueue::Ticket ticket;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    const int64_t now = options_.now_ms();
    bool changed = false;
    for (auto& [id, job] : jobs_) {
      v1::Job& j = job.record.job;
      if (j.state() != v1::JOB_STATE_RUNNING) continue;
      std::optional<v1::StallReport> stall =
          job.watch.Stalled(job.record.attempt, j.spec().watchdog(), j.spec().devices(), now);
      if (!stall) continue;
      const std::string why = absl::StrCat("stalled: ", ProgressWatch::Describe(*stall, now));
      std::fprintf(stderr, "ballastd: job %s %s\n", id.c_str(), why.c_str());
      v1::JobEvent event;
      *event.mutable_training()->mutable_stall() = *std::move(stall);
      ApplyTrainingEvent(&job, 0, event.training());
      AddEvent(&job, std::move(event));
      // Stops every rank and restarts from the newest checkpoint, counted
      // as a restart like a rank's failure.
      FailAttempt(&job, why, /*count_restart=*/true);
      changed = true;
    }
    if (!changed) return;
    RunScheduler();
    ticket = Flush();
  }
  (void)Commit(ticket);
}

}  // namespace ballast::server
