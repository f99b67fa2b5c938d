#include "server/job_metrics.h"

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metrics.h"

namespace ballast::server {
namespace {

// The guard's triggers, each with a series from the start.
constexpr const char* kAnomalyKinds[] = {"non_finite", "no_supervision", "spike", "collapse",
                                         "router_collapse"};

}  // namespace

JobMetrics::Snapshot JobMetrics::Read() const {
  Snapshot snap;
  absl::MutexLock lock(mu_);
  snap.jobs_by_state = history_->EvictedByState();
  for (const auto& [id, job] : *jobs_) ++snap.jobs_by_state[job.record.job.state()];
  snap.jobs_in_memory = jobs_->size();
  snap.workers_alive = workers_->alive();
  snap.workers_dead = static_cast<int64_t>(workers_->all().size()) - snap.workers_alive;
  snap.devices_busy = scheduler_->busy_devices();
  snap.devices_free = scheduler_->free_devices();

  // Per-job series: live jobs and the recently finished ones only.
  std::set<std::string> shown;
  for (std::string& id : history_->Shown(now_ms_())) shown.insert(std::move(id));
  for (const auto& [id, job] : *jobs_) {
    if (!Terminal(job.record.job.state())) shown.insert(id);
  }
  for (const std::string& id : shown) {
    auto it = jobs_->find(id);
    if (it == jobs_->end()) continue;
    const JobEntry& entry = it->second;
    const v1::Job& j = entry.record.job;
    JobSample& s = snap.jobs.emplace_back();
    s.id = id;
    s.state = j.state();
    s.step = j.step();
    if (j.has_last_step()) s.last_step = j.last_step();
    if (j.has_last_eval()) s.last_eval = j.last_eval();
    s.guard_rollbacks = j.guard_rollbacks();
    s.skipped_steps = j.skipped_steps();
    s.restarts = j.restarts();
    for (const char* kind : kAnomalyKinds) {
      auto n = j.anomalies().find(kind);
      s.anomalies.push_back(n == j.anomalies().end() ? 0.0 : static_cast<double>(n->second));
    }
    for (const auto& [rank, series] : entry.ranks) {
      s.ranks[rank] = {
          .step_seconds = series.step_seconds.Collect(),
          .peak_memory_bytes = series.peak_memory_bytes,
          .communicated_bytes = series.communicated_bytes,
          .replica_communicated_bytes = series.replica_communicated_bytes,
          .collective_wait_seconds = series.collective_wait_seconds,
          .straggler = std::find(j.straggler_ranks().begin(), j.straggler_ranks().end(), rank) !=
                       j.straggler_ranks().end()};
    }
  }
  return snap;
}

std::vector<prometheus::MetricFamily> JobMetrics::Collect() const {
  using prometheus::MetricFamily;
  using prometheus::MetricType;
  const Snapshot snap = Read();
  std::vector<MetricFamily> families;
  // Families are filled one at a time, each before the next is added.
  auto family = [&](const char* name, const char* help, MetricType type) -> MetricFamily& {
    return families.emplace_back(MetricFamily{name, help, type, {}});
  };
  auto sample = [](MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels,
                   double value) { AddSample(&f, std::move(labels), value); };
  MetricFamily& jobs = family("ballast_jobs", "Jobs by state.", MetricType::Gauge);
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    if (!v1::JobState_IsValid(s)) continue;
    auto n = snap.jobs_by_state.find(s);
    sample(jobs, {{"state", StateName(static_cast<v1::JobState>(s))}},
           n == snap.jobs_by_state.end() ? 0.0 : static_cast<double>(n->second));
  }
  sample(family("ballast_jobs_in_memory",
                "Jobs whose records ballastd holds in memory: the live ones and the recently "
                "finished. The others are read from the store.",
                MetricType::Gauge),
         {}, static_cast<double>(snap.jobs_in_memory));

  MetricFamily& workers = family("ballast_workers", "Registered workers.", MetricType::Gauge);
  sample(workers, {{"state", "alive"}}, static_cast<double>(snap.workers_alive));
  sample(workers, {{"state", "dead"}}, static_cast<double>(snap.workers_dead));
  MetricFamily& devices =
      family("ballast_worker_devices", "Devices of live workers.", MetricType::Gauge);
  sample(devices, {{"state", "busy"}}, static_cast<double>(snap.devices_busy));
  sample(devices, {{"state", "free"}}, static_cast<double>(snap.devices_free));

  // A job with no value has no sample: a scrape then reads "no data", never a
  // made-up 0 (before the first step) or NaN (a step without a loss).
  struct PerJob {
    const char* name;
    const char* help;
    MetricType type;
    std::function<std::optional<double>(const JobSample&)> value;
  };
  // Of the last step, when there is one.
  auto last_step = [](double (v1::StepMetrics::*field)() const) {
    return [field](const JobSample& j) -> std::optional<double> {
      if (!j.last_step) return std::nullopt;
      return ((*j.last_step).*field)();
    };
  };
  const PerJob per_job[] = {
      {"ballast_job_step", "Last optimizer step reported.", MetricType::Gauge,
       [](const JobSample& j) { return static_cast<double>(j.step); }},
      // With ballast_job_step, what a stall alert needs: running, yet no new step.
      {"ballast_job_running", "1 while the job is RUNNING (its ranks train), else 0.",
       MetricType::Gauge,
       [](const JobSample& j) { return j.state == v1::JOB_STATE_RUNNING ? 1.0 : 0.0; }},
      {"ballast_job_loss", "Loss of the last step; no sample when it had no supervised token.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_step || !j.last_step->has_loss()) return std::nullopt;
         return j.last_step->loss();
       }},
      {"ballast_job_grad_norm", "Global grad_norm of the last step.", MetricType::Gauge,
       last_step(&v1::StepMetrics::grad_norm)},
      {"ballast_job_learning_rate", "Learning rate of the last step.", MetricType::Gauge,
       last_step(&v1::StepMetrics::lr)},
      {"ballast_job_tokens_per_second", "Tokens per second of the last step.", MetricType::Gauge,
       last_step(&v1::StepMetrics::tokens_per_s)},
      {"ballast_job_supervised_tokens",
       "Supervised tokens (those with a label) in the last step, over all ranks: the loss's "
       "denominator.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_step) return std::nullopt;
         return static_cast<double>(j.last_step->supervised_tokens());
       }},
      // A Mixture-of-Experts model's only: a dense job has no series.
      {"ballast_job_moe_aux_loss",
       "A Mixture-of-Experts model's load-balancing loss in the last step, without "
       "router_aux_loss_coef.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_step || !j.last_step->has_aux_loss()) return std::nullopt;
         return j.last_step->aux_loss();
       }},
      {"ballast_job_moe_expert_load_max_ratio",
       "A Mixture-of-Experts model's largest expert load over the mean load, in its least "
       "balanced layer, in the last step: 1 when balanced, experts / experts per token when "
       "the router collapsed.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_step || !j.last_step->has_moe()) return std::nullopt;
         return j.last_step->moe().expert_load_max_ratio();
       }},
      {"ballast_job_rollbacks_total",
       "Rollbacks the guard took by itself over the job's life. A user's `ballast rollback` "
       "is not counted, here or in ballast_job_restarts_total.",
       MetricType::Counter,
       [](const JobSample& j) { return static_cast<double>(j.guard_rollbacks); }},
      {"ballast_job_skipped_steps_total",
       "Optimizer steps the guard kept from the weights over the job's life.", MetricType::Counter,
       [](const JobSample& j) { return static_cast<double>(j.skipped_steps); }},
      {"ballast_job_restarts_total",
       "Restarts after a failed attempt (a rank's error, a lost worker), counted against "
       "scheduling.max_restarts. A user's `ballast rollback` is not one.",
       MetricType::Counter, [](const JobSample& j) { return static_cast<double>(j.restarts); }},
      {"ballast_job_eval_loss",
       "The validation loss (eval.path or eval.fraction), as training defines it, at the last "
       "evaluation.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_eval || !j.last_eval->has_loss()) return std::nullopt;
         return j.last_eval->loss();
       }},
      {"ballast_job_eval_mrr_at_10",
       "A reranker's MRR@10 on its held-out groups (reranker.eval_path), at its last evaluation.",
       MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_eval || j.last_eval->has_loss()) return std::nullopt;
         return j.last_eval->mrr_at_10();
       }},
      {"ballast_job_eval_ndcg_at_10",
       "A reranker's NDCG@10 on its held-out groups, at its last evaluation.", MetricType::Gauge,
       [](const JobSample& j) -> std::optional<double> {
         if (!j.last_eval || j.last_eval->has_loss()) return std::nullopt;
         return j.last_eval->ndcg_at_10();
       }},
  };
  for (const PerJob& m : per_job) {
    MetricFamily& f = family(m.name, m.help, m.type);
    for (const JobSample& j : snap.jobs) {
      if (std::optional<double> value = m.value(j)) sample(f, {{"job_id", j.id}}, *value);
    }
  }
  // Every trigger from the start, at 0 until it happens: a rate() or an
  // alert needs the series before the first anomaly.
  MetricFamily& anomalies =
      family("ballast_job_anomalies_total",
             "Steps the guard found unhealthy (skipped, recovered by a re-run, rolled back or "
             "diagnosed) and checkpoints it refused, by trigger.",
             MetricType::Counter);
  for (const JobSample& j : snap.jobs) {
    for (size_t k = 0; k < std::size(kAnomalyKinds); ++k) {
      sample(anomalies, {{"job_id", j.id}, {"kind", kAnomalyKinds[k]}}, j.anomalies[k]);
    }
  }

  // Per-rank series, for the same jobs: each rank's own step time, memory
  // and traffic, where a slow or swapping rank shows up. Filled side by side,
  // so they are built here and appended at the end (a reference into
  // `families` would not survive the next family).
  MetricFamily step_seconds{"ballast_rank_step_seconds",
                            "Step time as each rank measured it.",
                            MetricType::Histogram,
                            {}};
  MetricFamily peak_memory{"ballast_rank_peak_memory_bytes",
                           "Peak memory of the rank: RSS on CPU, allocated device memory on a GPU.",
                           MetricType::Gauge,
                           {}};
  MetricFamily communicated{"ballast_rank_communicated_bytes_total",
                            "Bytes the rank sent in collectives since ballastd "
                            "started.",
                            MetricType::Counter,
                            {}};
  MetricFamily replica_communicated{"ballast_rank_replica_communicated_bytes_total",
                                    "Of ballast_rank_communicated_bytes_total, the bytes sent to "
                                    "the rank's replicas under hybrid sharding (the gradient "
                                    "shards' allreduce across shard groups).",
                                    MetricType::Counter,
                                    {}};
  MetricFamily collective_wait{"ballast_rank_collective_wait_seconds_total",
                               "Seconds the rank spent blocked on collectives (communication "
                               "not hidden behind compute) since ballastd started; its rate "
                               "over ballast_rank_step_seconds' is the share of a step spent "
                               "waiting.",
                               MetricType::Counter,
                               {}};
  MetricFamily straggler{"ballast_rank_straggler",
                         "1 while the progress watchdog counts the rank a straggler: its own "
                         "step time (outside collectives) above watchdog.straggler_factor times "
                         "the other ranks' median for watchdog.straggler_window steps; else 0.",
                         MetricType::Gauge,
                         {}};
  for (const JobSample& j : snap.jobs) {
    for (const auto& [rank, series] : j.ranks) {
      const std::vector<prometheus::ClientMetric::Label> labels = {{"job_id", j.id},
                                                                   {"rank", absl::StrCat(rank)}};
      prometheus::ClientMetric& s = step_seconds.metric.emplace_back(series.step_seconds);
      s.label = labels;
      if (series.peak_memory_bytes > 0) {
        sample(peak_memory, labels, static_cast<double>(series.peak_memory_bytes));
      }
      sample(communicated, labels, series.communicated_bytes);
      sample(replica_communicated, labels, series.replica_communicated_bytes);
      sample(collective_wait, labels, series.collective_wait_seconds);
      sample(straggler, labels, series.straggler ? 1 : 0);
    }
  }
  families.push_back(std::move(step_seconds));
  families.push_back(std::move(peak_memory));
  families.push_back(std::move(communicated));
  families.push_back(std::move(replica_communicated));
  families.push_back(std::move(collective_wait));
  families.push_back(std::move(straggler));
  return families;
}

}  // namespace ballast::server
