// Coordinator: the job state machine, workers and their leases, scheduling,
// and event fan-out, behind the JobService and WorkerService RPCs
// (docs/control-plane.md is the contract). Every change is written through
// the Store, so a restart resumes where it stopped: a call that changes
// something returns only once its change is stored, and a watcher sees an
// event only once it is stored. Other calls may see a change a moment
// before the call that made it returns.
//
// Thread-safe: one mutex guards the state; nothing under it blocks on a
// client or on the store. A call changes the state under the mutex, queues
// the change in a CommitQueue, and waits for the store after letting go, so
// concurrent calls share one transaction. Streams read through Mailboxes, so
// a slow watcher holds up no one.
//
// It runs the state machine and delegates the rest, as LevelDB's DBImpl
// delegates to VersionSet and MemTable: WorkerTable keeps the workers and
// their leases, JobHistory decides which finished jobs leave memory and the
// store, JobMetrics renders /metrics from a copy of the state, and
// EventWatch serves one watch stream.
#ifndef BALLAST_SERVER_COORDINATOR_H_
#define BALLAST_SERVER_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "ballast/v1/job_service.pb.h"
#include "ballast/v1/worker_service.pb.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/histogram.h"
#include "server/commit_queue.h"
#include "server/event_fanout.h"
#include "server/event_watch.h"
#include "server/job_entry.h"
#include "server/job_history.h"
#include "server/job_metrics.h"
#include "server/mailbox.h"
#include "server/scheduler.h"
#include "server/store.h"
#include "server/worker_table.h"

namespace ballast::server {

// Limits on one tenant; 0 is no limit.
struct TenantQuota {
  // Devices its running jobs hold at once; a job that would pass it waits.
  int32_t max_devices = 0;
  // Jobs it may have QUEUED; one more is refused with RESOURCE_EXHAUSTED.
  int32_t max_queued_jobs = 0;
};

// Finished jobs one PruneHistory deletes from the store at most: one pass a
// second keeps up with far more jobs than a cluster finishes, and no pass
// holds the store's writer long.
inline constexpr int64_t kJobsPrunedPerPass = 500;

struct CoordinatorOptions {
  // A job's output_dir is OUTPUT_ROOT/JOB_ID.
  std::string output_root;
  // Folders a spec's paths must lie in (common/job_spec_paths.h); empty: any.
  std::vector<std::string> path_roots;
  // A worker silent this long loses its ranks.
  int64_t lease_ms = 15000;
  // Events kept per job.
  int64_t event_retention = 10000;
  // A finished job's series stay on /metrics this long, so that a scrape
  // sees its end, then leave (at most finished_jobs_kept of them at once).
  int64_t metrics_retention_ms = 10 * 60 * 1000;
  // The newest finished jobs held in memory (within metrics_retention_ms);
  // older ones leave it and are read from the store, so that memory holds
  // the live jobs and these, however long the job history.
  size_t finished_jobs_kept = 1000;
  // The store keeps at least the newest this many finished jobs, with their
  // events, and deletes older ones (oldest first, kJobsPrunedPerPass a
  // pass). 0 keeps every job.
  int64_t job_history = 0;
  // Cancel -> SIGKILL delay sent with stop assignments.
  int64_t stop_grace_ms = 10000;
  // Sent with every start: a rank whose worker sends no keepalive for this
  // long stops by itself. A worker that loses its lease keeps its ranks (and
  // their devices) this long plus kFenceMarginMs more before its jobs are
  // requeued, so the old rank is gone before the new one starts. 0: ranks
  // do not fence themselves and jobs are requeued at lease expiry.
  int64_t agent_silence_ms = 0;
  // Rendezvous ports are kMasterPortBase + an offset that changes per attempt.
  int32_t master_port_base = 29500;
  // Bytes of jobs in one ListJobs page (besides page_size): half of gRPC's
  // default 4 MiB message limit, which jobs with large specs once passed,
  // breaking `ballast list` for every user. The client follows the pages.
  size_t list_page_bytes = size_t{2} << 20;
  // By tenant; a tenant not named gets default_quota.
  std::map<std::string, TenantQuota> quotas;
  TenantQuota default_quota;
  // Unix time in ms. Tests pass a fake clock to expire leases on demand.
  std::function<int64_t()> now_ms;
};

class Coordinator;

// One StreamAssignments stream of a worker. A newer stream of the same worker
// closes this one. Not thread-safe: one reader. Must not outlive its
// Coordinator.
class AssignmentFeed {
 public:
  // Moves the next assignments to *out, waiting up to `wait`. Returns true
  // while the stream stays current; false when a newer stream replaced it, the
  // worker's lease ran out, or the coordinator shuts down.
  bool Next(std::vector<v1::Assignment>* out, absl::Duration wait);
  // Puts back assignments whose delivery failed, for the worker's next stream.
  void Return(std::vector<v1::Assignment> undelivered);

 private:
  friend class Coordinator;
  AssignmentFeed(Coordinator* coordinator, std::string worker_id,
                 std::shared_ptr<Mailbox<v1::Assignment>> mailbox)
      : coordinator_(coordinator), worker_id_(std::move(worker_id)), mailbox_(std::move(mailbox)) {}
  Coordinator* const coordinator_;
  const std::string worker_id_;
  std::shared_ptr<Mailbox<v1::Assignment>> mailbox_;
};

class Coordinator {
 public:
  // Loads jobs and workers from `store`, gives every known worker a fresh
  // lease, and queues what was queued. `store` and `metrics` must outlive it,
  // and `metrics` must not be scraped once it is gone: its per-job series
  // come from a Collectable of its own that it adds to `metrics`.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(Store* store, MetricsRegistry* metrics,
                                                             CoordinatorOptions options);
  ~Coordinator();

  // --- JobService ---
  // Each call on a job takes a `scope`: the tenant whose jobs the caller may
  // see, or empty for every tenant (an admin). A job outside the scope is
  // NOT_FOUND, exactly like a job that does not exist.
  //
  // Validates (ranges and files) and queues a job of `tenant`. With a
  // request_id the tenant used before, returns that job unchanged.
  // INVALID_ARGUMENT names the field, or gives the largest gang the live
  // workers can place when `devices` is above it (with no live worker yet,
  // the job is queued). RESOURCE_EXHAUSTED names the tenant's quota.
  //
  // Returns before the job is stored: `done` gets the job once it is (or the
  // error), on the store's writer thread or on the caller's, so that no
  // thread waits for the store per call. `done` must not block.
  using JobDone = std::function<void(absl::StatusOr<v1::Job>)>;
  void SubmitJob(v1::JobSpec spec, const std::string& request_id, const std::string& tenant,
                 JobDone done);
  // The same, returning once `done` would be called.
  absl::StatusOr<v1::Job> SubmitJob(v1::JobSpec spec, const std::string& request_id,
                                    const std::string& tenant = kDefaultTenant);
  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, const std::string& scope = "");
  // Newest first; INVALID_ARGUMENT for a bad page_size or page_token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                const std::string& scope = "");
  // What each rank of a job reported, across attempts (the ballast_rank_*
  // series): steps timed, their total seconds, peak memory, bytes sent.
  struct RankStats {
    int32_t rank = 0;
    uint64_t steps = 0;
    double step_seconds = 0;
    int64_t peak_memory_bytes = 0;
    double communicated_bytes = 0;
    double replica_communicated_bytes = 0;
    double collective_wait_seconds = 0;
  };
  // By rank; NOT_FOUND for an unknown id.
  absl::StatusOr<std::vector<RankStats>> JobRankStats(const std::string& job_id,
                                                      const std::string& scope = "");
  // QUEUED -> CANCELLED; running -> CANCELLING until its ranks are gone.
  // Terminal or already cancelling: the job unchanged.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& scope = "");
  // Stops the ranks and requeues the job to resume at or before to_step.
  // FAILED_PRECONDITION when terminal or cancelling; INVALID_ARGUMENT when
  // to_step is outside 1..step.
  absl::StatusOr<v1::Job> RollbackJob(const std::string& job_id, int64_t to_step,
                                      const std::string& scope = "");
  // NOT_FOUND for an unknown id. The watch must be destroyed before the
  // coordinator.
  absl::StatusOr<std::unique_ptr<EventWatch>> WatchJob(const std::string& job_id, int64_t after_seq,
                                                       const std::string& scope = "");
  std::vector<v1::Worker> ListWorkers();

  // --- WorkerService ---
  // INVALID_ARGUMENT for a bad host, device_kind or capacity. A worker
  // token's `bound_worker_id` is the id it registers as, whatever the
  // request's previous_worker_id says; without one, previous_worker_id
  // re-adopts.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const std::string& bound_worker_id = "");
  // NOT_FOUND when the worker is unknown or its lease ran out: register again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // NOT_FOUND when the worker is unknown or dead. Replaces the worker's
  // previous stream, which ends.
  absl::StatusOr<std::unique_ptr<AssignmentFeed>> StreamAssignments(const std::string& worker_id);
  // Applies rank events at most once per (worker, report_id); only events of
  // ranks assigned to that worker count. NOT_FOUND when the worker is
  // unknown or dead; INVALID_ARGUMENT for a report_id beyond what the worker
  // could have reached (one far ahead would make every later report look
  // seen before).
  //
  // The acknowledgement waits for the store, as SubmitJob's reply does, and
  // goes to `done` on the store's writer thread (or on the caller's): the
  // workers' reports are the busiest writes, and a thread per report waiting
  // for its commit cost more than the reports. `done` must not block.
  using ReportDone = std::function<void(absl::StatusOr<v1::ReportEventsResponse>)>;
  void ReportEvents(const v1::ReportEventsRequest& request, ReportDone done);
  // The same, returning once `done` would be called.
  absl::StatusOr<v1::ReportEventsResponse> ReportEvents(const v1::ReportEventsRequest& request);

  // Marks workers past their lease dead, and once agent_silence_ms (and the
  // margin) more have passed, gives up their ranks: their jobs are requeued
  // (or failed). Called by the lease thread; tests call it after moving
  // their clock.
  void ExpireLeases();
  // Declares stalled the running jobs whose progress watch says so
  // (progress_watch.h): records the stall as an event and restarts the job
  // from its newest checkpoint (a restart). Called by the lease thread;
  // tests call it after moving their clock.
  void WatchProgress() ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes from the store finished jobs beyond the newest job_history (a
  // bounded number a call). Called by the lease thread once a second; tests
  // call it directly.
  void PruneHistory() ABSL_LOCKS_EXCLUDED(mu_);

  // What a dead worker's ranks get beyond agent_silence_ms to notice the
  // silence (they look four times per limit) and exit.
  static constexpr int64_t kFenceMarginMs = 1000;
  // How far past the coordinator's clock a report_id (in microseconds) may
  // be: room for clock skew between hosts, not for a forged id.
  static constexpr int64_t kReportIdHorizonMs = 24 * 3600 * 1000;

  // Ends every stream and stops the lease thread. Idempotent.
  void Shutdown();

  // The store answers.
  absl::Status Healthy() { return store_->Ping(); }

 private:
  friend class AssignmentFeed;

  // A rank of some attempt, live on a device: (job_id, attempt, rank).
  using RankKey = std::tuple<std::string, int32_t, int32_t>;

  Coordinator(Store* store, MetricsRegistry* metrics, CoordinatorOptions options);
  absl::Status Load();
  void LeaseLoop();
  // Finished jobs past metrics_retention_ms leave /metrics and memory: the
  // lease thread's part of JobHistory, so that retention needs no scrape.
  void RetireFinishedJobs() ABSL_LOCKS_EXCLUDED(mu_);

  JobEntry* FindJob(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job if `scope` (a tenant, or empty for all) may see it; NOT_FOUND else.
  absl::StatusOr<JobEntry*> VisibleJob(const std::string& job_id, const std::string& scope)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A job that left memory, from the store; NOT_FOUND as VisibleJob says it.
  // Only finished jobs leave: one that is found is terminal.
  absl::StatusOr<JobRecord> EvictedJob(const std::string& job_id, const std::string& scope);
  // Takes the jobs whose evicted record is stored out of memory, and marks
  // the ones JobHistory has to evict as evicted, for this Flush to write.
  // Called by Flush: a JobEntry* that is not dirty may dangle after a Flush.
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const TenantQuota& QuotaOf(const std::string& tenant) const;
  // RESOURCE_EXHAUSTED when a new job of `devices` would pass the tenant's
  // quota: more devices than it may ever hold, or one queued job too many.
  absl::Status CheckQuota(const std::string& tenant, int32_t devices) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds an event with the job's next seq, the time and the attempt; Flush
  // queues it to be stored, then published.
  void AddEvent(JobEntry* job, v1::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the state and adds its StateChange event.
  void Transition(JobEntry* job, v1::JobState to, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the job changed without a new event.
  void Touch(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Has the next Flush write the job as it is, changed or not.
  void WriteAgain(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues every changed job with its events, and every changed worker, to
  // be stored together; once stored, the events go to the jobs' watchers.
  // Ends each public operation, whose caller then waits for the ticket
  // without the lock (Commit).
  CommitQueue::Ticket Flush() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `ticket`'s changes to be stored. On an error they stay in
  // memory, authoritative for this run, and the job's or worker's next write
  // carries them.
  absl::Status Commit(CommitQueue::Ticket ticket) ABSL_LOCKS_EXCLUDED(mu_);
  // `result` once `ticket`'s changes are stored, else the store's error.
  template <typename T>
  absl::StatusOr<T> AfterCommit(CommitQueue::Ticket ticket, T result) ABSL_LOCKS_EXCLUDED(mu_) {
    if (absl::Status s = Commit(ticket); !s.ok()) return s;
    return result;
  }
  // ReportEvents up to its commit: applies the report (once) and queues the
  // worker's record and the events; *ticket is the commit to wait for.
  absl::Status ApplyReport(const v1::ReportEventsRequest& request,
                           v1::ReportEventsResponse* response, CommitQueue::Ticket* ticket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AfterCommit without waiting: `done` gets what it would return.
  template <typename T>
  void ReplyAfterCommit(CommitQueue::Ticket ticket, T result,
                        std::function<void(absl::StatusOr<T>)> done) ABSL_LOCKS_EXCLUDED(mu_) {
    commits_.WhenWritten(ticket, [result = std::move(result),
                                  done = std::move(done)](const absl::Status& status) mutable {
      if (!status.ok()) {
        LogStoreWriteFailure(status);
        return done(status);
      }
      done(std::move(result));
    });
  }
  static void LogStoreWriteFailure(const absl::Status& status);
  // What a call on the callback form of `start` gives, waited for: the sync
  // forms of SubmitJob and ReportEvents (tests, in-process callers).
  template <typename T, typename Start>
  static absl::StatusOr<T> WaitForReply(Start start) {
    absl::Notification replied;
    absl::StatusOr<T> result;
    start([&](absl::StatusOr<T> reply) {
      result = std::move(reply);
      replied.Notify();
    });
    replied.WaitForNotification();
    return result;
  }
  // The part of SubmitJob before the lock: the repeated request_id of an
  // evicted job (its job), the spec's checks, and a new job id.
  struct Admission {
    std::optional<v1::Job> evicted;
    std::string id;
  };
  absl::StatusOr<Admission> Admit(v1::JobSpec* spec, const std::string& request_key,
                                  const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Whether `job_id` is a job of `tenant`, in memory or in the store.
  bool IsJobOfTenant(const std::string& job_id, const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);

  // Live ranks of the job's current attempt.
  std::vector<std::pair<RankKey, Device>> LiveRanks(const JobEntry& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends a stop assignment to every live rank of the current attempt.
  void StopRanks(const JobEntry& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SendStop(const RankKey& key, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(const std::string& worker_id, v1::Assignment assignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A live rank is gone: frees its device, and lets its job's next attempt
  // be scheduled once no rank of the job runs any more.
  void ReleaseRank(const RankKey& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a QUEUED job in the scheduler unless a rank of it (of any
  // attempt) still runs: two ranks of one job and rank number never run at
  // once.
  void EnqueueIfIdle(JobEntry* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool HasLiveRanks(const std::string& job_id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current attempt's rank ended: exit_code >= 0 from RankExited, or
  // kLost when its worker went away. Drives the state machine.
  void OnRankGone(JobEntry* job, int32_t rank, int32_t exit_code, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current attempt after a failure: stops the other ranks and
  // requeues the job, or fails it when restarts are spent.
  void FailAttempt(JobEntry* job, const std::string& reason, bool count_restart)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Requeue(JobEntry* job, const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts what fits and sends the start assignments.
  void RunScheduler() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a live worker and its live ranks into the scheduler.
  void MakeSchedulable(WorkerEntry* worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker is marked dead (WorkerTable::MarkDead) and leaves the
  // scheduler. Its ranks stay live until ReleaseLostRanks.
  void MarkDead(WorkerEntry* worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Gives up a dead worker's ranks; false when it had none.
  bool ReleaseLostRanks(const WorkerEntry& worker, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the worker's record for the next Flush.
  void PutWorker(const WorkerEntry& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ApplyRankEvent(const std::string& worker_id, const v1::RankEvent& event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FeedCurrent(const std::string& worker_id, const Mailbox<v1::Assignment>* mailbox);
  void ReturnAssignments(const std::string& worker_id, std::vector<v1::Assignment> undelivered);

  Store* const store_;
  const CoordinatorOptions options_;
  // In the MetricsRegistry given to Create; thread-safe.
  prometheus::Counter& events_dropped_;
  prometheus::Counter& jobs_pruned_;
  prometheus::Histogram& queue_seconds_;
  prometheus::Histogram& scheduler_decision_seconds_;

  absl::Mutex mu_;
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  // Submission order -> job id, for ListJobs (newest first).
  std::map<int64_t, std::string> job_order_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> request_ids_ ABSL_GUARDED_BY(mu_);
  WorkerTable workers_ ABSL_GUARDED_BY(mu_);
  // Every live rank of every attempt, and where it runs.
  std::map<RankKey, Device> live_ranks_ ABSL_GUARDED_BY(mu_);
  Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  // QUEUED jobs by tenant, for the max_queued_jobs quota; kept by Transition.
  std::map<std::string, int64_t> queued_by_tenant_ ABSL_GUARDED_BY(mu_);
  std::vector<JobEntry*> dirty_ ABSL_GUARDED_BY(mu_);
  // Worker records changed since the last Flush.
  std::vector<WorkerRecord> unsaved_workers_ ABSL_GUARDED_BY(mu_);
  // The finished jobs in memory and those leaving it. Its own mutex, taken
  // after mu_ (the store's writer thread reports evictions without mu_).
  JobHistory history_;
  // The scrape's view of the state above, under mu_: the Collectable that
  // Create adds to the MetricsRegistry.
  const JobMetrics job_metrics_;
  int64_t last_order_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t port_counter_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::CondVar lease_wake_;
  std::thread lease_thread_;
  // Last, so destroyed first: its writer thread runs `then`s that use the
  // members above.
  CommitQueue commits_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_COORDINATOR_H_
