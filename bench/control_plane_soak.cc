// Steady churn against a running ballastd, for bench/soak: simulated
// workers take jobs, report steps and finish them, while a submitter keeps
// the queue fed and watchers follow running jobs to their end. Nothing here
// measures; bench/soak samples ballastd's memory while this runs.
//
//   control_plane_soak --coordinator HOST:PORT --seconds N
//
// Prints one line of totals at the end; exits 1 when a call failed or a
// watcher saw a gap.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "bench/control_plane_common.h"

namespace {

using Clock = std::chrono::steady_clock;
using ballast::bench::Context;
using ballast::bench::SpecFolder;
using ballast::v1::JobService;
using ballast::v1::WorkerService;

constexpr int kWorkers = 4;
constexpr int kDevicesPerWorker = 4;
constexpr int kWatchers = 4;
// Each rank reports this many steps, kStepsPerReport per report, then exits.
constexpr int kStepsPerJob = 20;
constexpr int kStepsPerReport = 5;
constexpr auto kReportPeriod = std::chrono::milliseconds(50);
// The submitter keeps about this many jobs waiting behind the running ones.
constexpr int kQueued = 32;
constexpr auto kHeartbeatPeriod = std::chrono::seconds(2);

struct Totals {
  std::atomic<int64_t> submitted{0};
  std::atomic<int64_t> finished{0};
  std::atomic<int64_t> events{0};
  std::atomic<int64_t> watched{0};
  std::atomic<int64_t> failures{0};
};

// One simulated worker: its assignment stream, and the ranks it runs.
class Worker {
 public:
  Worker(std::shared_ptr<grpc::Channel> channel, Totals* totals)
      : stub_(WorkerService::NewStub(channel)), totals_(totals) {}

  bool Register() {
    ballast::v1::RegisterWorkerRequest reg;
    reg.set_host("127.0.0.1");
    reg.set_device_kind("cpu");
    reg.set_capacity(kDevicesPerWorker);
    ballast::v1::RegisterWorkerResponse registered;
    if (!stub_->RegisterWorker(Context().get(), reg, &registered).ok()) return false;
    id_ = registered.worker_id();
    stream_context_ = Context(24 * 3600);
    return true;
  }

  void Run(const std::atomic<bool>& running) {
    std::thread reader([&] { ReadAssignments(); });
    auto next_heartbeat = Clock::now();
    while (running.load()) {
      if (Clock::now() >= next_heartbeat) {
        ballast::v1::HeartbeatRequest beat;
        beat.set_worker_id(id_);
        ballast::v1::HeartbeatResponse ok;
        if (!stub_->Heartbeat(Context().get(), beat, &ok).ok()) ++totals_->failures;
        next_heartbeat += kHeartbeatPeriod;
      }
      Report();
      std::this_thread::sleep_for(kReportPeriod);
    }
    stream_context_->TryCancel();
    reader.join();
  }

 private:
  struct Rank {
    ballast::v1::Assignment start;
    int64_t step = 0;
  };

  void ReadAssignments() {
    ballast::v1::StreamAssignmentsRequest request;
    request.set_worker_id(id_);
    auto stream = stub_->StreamAssignments(stream_context_.get(), request);
    ballast::v1::Assignment a;
    while (stream->Read(&a)) {
      if (a.action() != ballast::v1::Assignment::ACTION_START) continue;
      std::lock_guard<std::mutex> lock(mu_);
      ranks_.push_back({a, 0});
    }
    stream->Finish();
  }

  // Every running rank's next steps; a rank done with its steps exits 0.
  void Report() {
    ballast::v1::ReportEventsRequest report;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ranks_.empty()) return;
      for (auto rank = ranks_.begin(); rank != ranks_.end();) {
        for (int i = 0; i < kStepsPerReport && rank->step < kStepsPerJob; ++i) {
          ballast::v1::RankEvent* e = report.add_events();
          e->set_job_id(rank->start.job_id());
          e->set_attempt(rank->start.attempt());
          e->set_rank(rank->start.rank());
          ballast::v1::StepMetrics* m = e->mutable_training()->mutable_step_metrics();
          m->set_step(++rank->step);
          m->set_loss(2.5);
          m->set_step_time_s(0.05);
        }
        if (rank->step < kStepsPerJob) {
          ++rank;
          continue;
        }
        ballast::v1::RankEvent* e = report.add_events();
        e->set_job_id(rank->start.job_id());
        e->set_attempt(rank->start.attempt());
        e->set_rank(rank->start.rank());
        e->mutable_exited()->set_exit_code(0);
        ++totals_->finished;
        rank = ranks_.erase(rank);
      }
    }
    report.set_worker_id(id_);
    report.set_report_id(++report_id_);
    totals_->events += report.events_size();
    ballast::v1::ReportEventsResponse ack;
    // At least once, as a real worker: resend the same report until acked.
    while (!stub_->ReportEvents(Context().get(), report, &ack).ok()) {
      ++totals_->failures;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  std::unique_ptr<WorkerService::Stub> stub_;
  Totals* const totals_;
  std::string id_;
  int64_t report_id_ = 0;
  std::unique_ptr<grpc::ClientContext> stream_context_;
  std::mutex mu_;
  std::vector<Rank> ranks_;
};

// Follows the newest running job to its end, checking seqs are contiguous,
// until `running` turns false and *context is cancelled.
void Watch(JobService::Stub* jobs, const std::atomic<bool>& running, std::mutex* mu,
           std::unique_ptr<grpc::ClientContext>* context, Totals* totals) {
  while (running.load()) {
    ballast::v1::ListJobsRequest list;
    list.add_states(ballast::v1::JOB_STATE_RUNNING);
    list.set_page_size(1);
    ballast::v1::ListJobsResponse listed;
    if (!jobs->ListJobs(Context().get(), list, &listed).ok() || listed.jobs_size() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    ballast::v1::WatchJobRequest request;
    request.set_job_id(listed.jobs(0).id());
    grpc::ClientContext* current;
    {
      std::lock_guard<std::mutex> lock(*mu);
      if (!running.load()) return;
      *context = Context();
      current = context->get();
    }
    auto stream = jobs->WatchJobBatched(current, request);
    ballast::v1::WatchJobBatch batch;
    int64_t last = 0;
    while (stream->Read(&batch)) {
      for (const ballast::v1::JobEvent& e : batch.events()) {
        if (e.seq() != last + 1) ++totals->failures;
        last = e.seq();
      }
    }
    if (stream->Finish().ok()) ++totals->watched;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string coordinator;
  int seconds = 600;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--coordinator") == 0) coordinator = argv[i + 1];
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atoi(argv[i + 1]);
  }
  if (coordinator.empty() || seconds <= 0) {
    std::fprintf(stderr, "usage: control_plane_soak --coordinator HOST:PORT --seconds N\n");
    return 2;
  }
  const SpecFolder folder("ballast-soak");
  const ballast::v1::JobSpec spec = folder.Spec(kStepsPerJob);

  auto channel = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials());
  auto jobs = JobService::NewStub(channel);
  Totals totals;
  std::atomic<bool> running{true};
  std::vector<std::unique_ptr<Worker>> workers;
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    workers.push_back(std::make_unique<Worker>(channel, &totals));
    if (!workers.back()->Register()) {
      std::fprintf(stderr, "control_plane_soak: cannot register at %s\n", coordinator.c_str());
      return 1;
    }
    threads.emplace_back([&, raw = workers.back().get()] { raw->Run(running); });
  }
  std::mutex watch_mu;
  std::vector<std::unique_ptr<grpc::ClientContext>> watches(kWatchers);
  for (int w = 0; w < kWatchers; ++w) {
    threads.emplace_back([&, w] { Watch(jobs.get(), running, &watch_mu, &watches[w], &totals); });
  }
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    // Keep kQueued waiting: as many submissions as jobs finished since.
    const int64_t waiting = totals.submitted - totals.finished - kWorkers * kDevicesPerWorker;
    if (waiting < kQueued) {
      ballast::v1::SubmitJobRequest submit;
      *submit.mutable_spec() = spec;
      ballast::v1::Job job;
      if (jobs->SubmitJob(Context().get(), submit, &job).ok()) {
        ++totals.submitted;
      } else {
        ++totals.failures;
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  {
    std::lock_guard<std::mutex> lock(watch_mu);
    running = false;
    for (auto& context : watches) {
      if (context != nullptr) context->TryCancel();
    }
  }
  for (std::thread& t : threads) t.join();
  std::printf(
      "control_plane_soak: %d s: %lld jobs submitted, %lld finished, %lld events reported, "
      "%lld watches to the end, %lld failures\n",
      seconds, static_cast<long long>(totals.submitted.load()),
      static_cast<long long>(totals.finished.load()), static_cast<long long>(totals.events.load()),
      static_cast<long long>(totals.watched.load()),
      static_cast<long long>(totals.failures.load()));
  return totals.failures.load() == 0 ? 0 : 1;
}
