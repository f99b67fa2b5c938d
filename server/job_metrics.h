// JobMetrics: the coordinator's series computed at scrape time, a const view
// of its state and the prometheus::Collectable that MetricsRegistry reads: jobs by state, workers
// and their devices, and one series per live or recently finished job (its step, loss, guard
// counters...) and per rank of it. A job's series are there while JobHistory shows it and are gone
// the scrape after, with nothing to delete. README's metrics table lists them.
//
// Thread-safe. Collect reads the state under the coordinator's mutex, copying
// the few numbers it needs, and builds the families after letting go, so a
// scrape holds the mutex for the copy alone.
#ifndef BALLAST_SERVER_JOB_METRICS_H_
#define BALLAST_SERVER_JOB_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "server/job_entry.h"
#include "server/job_history.h"
#include "server/scheduler.h"
#include "server/worker_table.h"

namespace ballast::server {

class JobMetrics : public prometheus::Collectable {
 public:
  // Views the state the coordinator guards with `mu`; every pointer must
  // outlive this view. `now_ms` is the coordinator's clock.
  JobMetrics(absl::Mutex* mu, const std::map<std::string, JobEntry>* jobs,
             const WorkerTable* workers, const Scheduler* scheduler, const JobHistory* history,
             std::function<int64_t()> now_ms)
      : mu_(mu),
        jobs_(jobs),
        workers_(workers),
        scheduler_(scheduler),
        history_(history),
        now_ms_(std::move(now_ms)) {}

  // The families, each with its samples; a value a job does not have yet (a
  // loss before the first step) has no sample rather than a made-up 0.
  std::vector<prometheus::MetricFamily> Collect() const ABSL_LOCKS_EXCLUDED(mu_) override;

 private:
  // What a scrape reads of one rank of a shown job (RankSeries).
  struct RankSample {
    prometheus::ClientMetric step_seconds;
    int64_t peak_memory_bytes = 0;
    double communicated_bytes = 0;
    double replica_communicated_bytes = 0;
    double collective_wait_seconds = 0;
    // In the job's straggler_ranks (the progress watchdog's).
    bool straggler = false;
  };
  // What a scrape reads of one shown job.
  struct JobSample {
    std::string id;
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    int64_t step = 0;
    std::optional<v1::StepMetrics> last_step;
    std::optional<v1::EvalReport> last_eval;
    int64_t guard_rollbacks = 0;
    int64_t skipped_steps = 0;
    int64_t restarts = 0;
    // By kAnomalyKinds' order.
    std::vector<double> anomalies;
    std::map<int32_t, RankSample> ranks;
  };
  // Everything a scrape reads, copied under the mutex.
  struct Snapshot {
    std::map<int, int64_t> jobs_by_state;
    size_t jobs_in_memory = 0;
    int64_t workers_alive = 0;
    int64_t workers_dead = 0;
    int64_t devices_busy = 0;
    int64_t devices_free = 0;
    // Live and recently finished jobs, by id.
    std::vector<JobSample> jobs;
  };
  Snapshot Read() const ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex* const mu_;
  const std::map<std::string, JobEntry>* const jobs_ ABSL_PT_GUARDED_BY(mu_);
  const WorkerTable* const workers_ ABSL_PT_GUARDED_BY(mu_);
  const Scheduler* const scheduler_ ABSL_PT_GUARDED_BY(mu_);
  const JobHistory* const history_;
  const std::function<int64_t()> now_ms_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_JOB_METRICS_H_
