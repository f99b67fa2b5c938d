// Control-plane benchmarks: ballastd in-process on loopback, real gRPC and a
// real SQLite store in a temporary folder. Prints one row per benchmark:
//   control_plane/submit     SubmitJob latency, 100 concurrent clients
//   control_plane/watch      WatchJobBatched fan-out (the CLI's watch), 100 watchers, 1,000
//   events/s control_plane/scheduler  10,000 queued jobs on 1,000 simulated workers
//   control_plane/scrape     GET /metrics with 1,000 running jobs of 4 ranks: latency, CPU,
//                            allocations and how long it keeps the coordinator's lock
//   control_plane/report     ReportEvents latency, 100 workers reporting at once
// Absolute figures (there is no other coordinator to compare with); about
// 30 s in all. BALLAST_BENCH_STORE, when set, is the store URL instead of a
// SQLite file, with {name} replaced by the benchmark's name (each on a
// database of its own: bench/control_plane_store.py makes them).
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <map>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_replace.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "bench/control_plane_common.h"
#include "server/ballastd.h"
#include "server/scheduler.h"

// Allocations per scrape. This binary replaces the global operator new and
// counts the calls made on a thread while it asks to be counted: the
// registry, the collectors and the encoder allocate through it (containers,
// strings, std::function), and other threads' allocations stay out. Not
// mallinfo2: it gives the bytes in use, in which what a scrape allocates and
// frees again does not show; glibc has no malloc hook left (removed in 2.34).
// new[] and the nothrow forms go through this operator new; aligned new does
// not, and is not counted.
namespace {
thread_local bool t_count_allocations = false;
thread_local uint64_t t_allocations = 0;
thread_local uint64_t t_allocated_bytes = 0;
}  // namespace

void* operator new(size_t size) {
  if (t_count_allocations) {
    ++t_allocations;
    t_allocated_bytes += size;
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace {

using Clock = std::chrono::steady_clock;
using ballast::bench::Context;
using ballast::bench::SpecFolder;
using ballast::server::Ballastd;
using ballast::v1::JobService;
using ballast::v1::WorkerService;

constexpr int kSubmitClients = 100;
constexpr int kSubmitsPerClient = 20;
constexpr int kWatchers = 100;
constexpr int kEventsPerSecond = 1000;
constexpr int kWatchSeconds = 3;
constexpr int kQueuedJobs = 10000;
constexpr int kWorkers = 1000;
constexpr int kDevicesPerWorker = 8;
constexpr double kSchedulerSeconds = 3;
constexpr int kScrapeJobs = 1000;
constexpr int kRanksPerJob = 4;
constexpr int kScrapes = 50;
constexpr int kReportWorkers = 100;
constexpr int kReportsPerWorker = 50;
constexpr int kStepsPerReport = 5;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The q-quantile (0..1) of `values`, nearest rank.
double Quantile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  const size_t k = std::min(values.size() - 1, static_cast<size_t>(q * values.size()));
  std::nth_element(values.begin(), values.begin() + k, values.end());
  return values[k];
}

class Bench {
 public:
  std::unique_ptr<Ballastd> StartServer(const std::string& name) {
    ballast::server::BallastdOptions o;
    o.listen = "127.0.0.1:0";
    o.http = "127.0.0.1:0";
    if (const char* url = std::getenv("BALLAST_BENCH_STORE")) {
      o.store_url = absl::StrReplaceAll(url, {{"{name}", name}});
    } else {
      o.store_url = "sqlite:" + (folder_.dir() / (name + ".db")).string();
    }
    o.output_root = (folder_.dir() / "jobs").string();
    auto server = Ballastd::Start(o);
    if (!server.ok()) {
      std::fprintf(stderr, "control_plane_bench: %s\n", server.status().ToString().c_str());
      std::exit(1);
    }
    return std::move(*server);
  }

  void Submit() {
    auto server = StartServer("submit");
    std::vector<std::vector<double>> latencies(kSubmitClients);
    std::atomic<int> failures{0};
    std::vector<std::thread> clients;
    // The calls are timed once every client is connected: 100 TCP and
    // HTTP/2 handshakes at once made up the whole tail before (the first
    // call of each client: p50 31 ms, against 17 ms for the others).
    std::latch connected(kSubmitClients + 1);
    for (int c = 0; c < kSubmitClients; ++c) {
      clients.emplace_back([&, c] {
        // Each client its own connection, as separate CLI processes would be.
        grpc::ChannelArguments args;
        args.SetInt("grpc.channel_id", c);
        auto channel = grpc::CreateCustomChannel(server->grpc_address(),
                                                 grpc::InsecureChannelCredentials(), args);
        auto stub = JobService::NewStub(channel);
        if (!channel->WaitForConnected(std::chrono::system_clock::now() +
                                       std::chrono::seconds(30))) {
          ++failures;
        }
        connected.arrive_and_wait();
        for (int i = 0; i < kSubmitsPerClient; ++i) {
          ballast::v1::SubmitJobRequest request;
          *request.mutable_spec() = spec_;
          request.set_request_id("c" + std::to_string(c) + "-" + std::to_string(i));
          ballast::v1::Job job;
          const auto start = Clock::now();
          if (!stub->SubmitJob(Context().get(), request, &job).ok()) ++failures;
          latencies[c].push_back(Ms(Clock::now() - start));
        }
      });
    }
    connected.arrive_and_wait();
    const auto begin = Clock::now();
    for (auto& t : clients) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    std::vector<double> all;
    for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
    std::printf(
        "control_plane/submit: p50=%.2fms p99=%.2fms with %d concurrent clients (%zu calls, "
        "%.0f calls/s, %d failed)\n",
        Quantile(all, 0.5), Quantile(all, 0.99), kSubmitClients, all.size(), all.size() / seconds,
        failures.load());
  }

  void Watch() {
    auto server = StartServer("watch");
    auto channel = grpc::CreateChannel(server->grpc_address(), grpc::InsecureChannelCredentials());
    auto jobs = JobService::NewStub(channel);
    auto workers = WorkerService::NewStub(channel);

    ballast::v1::RegisterWorkerRequest reg;
    reg.set_host("127.0.0.1");
    reg.set_device_kind("cpu");
    reg.set_capacity(1);
    ballast::v1::RegisterWorkerResponse registered;
    workers->RegisterWorker(Context().get(), reg, &registered);
    auto stream_context = Context(60);
    ballast::v1::StreamAssignmentsRequest stream_request;
    stream_request.set_worker_id(registered.worker_id());
    auto assignments = workers->StreamAssignments(stream_context.get(), stream_request);
    ballast::v1::SubmitJobRequest submit;
    *submit.mutable_spec() = spec_;
    ballast::v1::Job job;
    jobs->SubmitJob(Context().get(), submit, &job);
    ballast::v1::Assignment start;
    if (!assignments->Read(&start)) {
      std::fprintf(stderr, "control_plane_bench: no start assignment\n");
      std::exit(1);
    }

    const int total = kEventsPerSecond * kWatchSeconds;
    // Send time of each step, written before its report goes out.
    std::vector<std::atomic<int64_t>> sent_ns(total + 1);
    std::vector<std::vector<double>> lags(kWatchers);
    std::atomic<int> ready{0};
    std::vector<std::thread> watchers;
    for (int w = 0; w < kWatchers; ++w) {
      watchers.emplace_back([&, w] {
        auto context = Context(60);
        ballast::v1::WatchJobRequest request;
        request.set_job_id(job.id());
        auto stream = jobs->WatchJobBatched(context.get(), request);
        ballast::v1::WatchJobBatch batch;
        bool counted = false;
        while (stream->Read(&batch)) {
          if (!counted) {
            ++ready;  // replay reached us: the watch is registered
            counted = true;
          }
          const int64_t now = Clock::now().time_since_epoch().count();
          for (const ballast::v1::JobEvent& e : batch.events()) {
            if (!e.training().has_step_metrics()) continue;
            lags[w].push_back((now - sent_ns[e.training().step_metrics().step()].load()) / 1e6);
          }
        }
        stream->Finish();
      });
    }
    while (ready.load() < kWatchers) std::this_thread::sleep_for(std::chrono::milliseconds(5));

    // 10 events every 10 ms: 1,000 events/s.
    constexpr int kBatch = kEventsPerSecond / 100;
    int64_t report_id = 0;
    const auto begin = Clock::now();
    for (int step = 1; step <= total;) {
      ballast::v1::ReportEventsRequest report;
      report.set_worker_id(registered.worker_id());
      report.set_report_id(++report_id);
      for (int i = 0; i < kBatch && step <= total; ++i, ++step) {
        sent_ns[step] = Clock::now().time_since_epoch().count();
        ballast::v1::RankEvent* e = report.add_events();
        e->set_job_id(job.id());
        e->set_attempt(start.attempt());
        e->mutable_training()->mutable_step_metrics()->set_step(step);
      }
      ballast::v1::ReportEventsResponse ack;
      workers->ReportEvents(Context().get(), report, &ack);
      std::this_thread::sleep_until(begin + std::chrono::milliseconds(10 * report_id));
    }
    ballast::v1::ReportEventsRequest done;
    done.set_worker_id(registered.worker_id());
    done.set_report_id(++report_id);
    ballast::v1::RankEvent* exit = done.add_events();
    exit->set_job_id(job.id());
    exit->set_attempt(start.attempt());
    exit->mutable_exited()->set_exit_code(0);
    ballast::v1::ReportEventsResponse ack;
    workers->ReportEvents(Context().get(), done, &ack);
    for (auto& t : watchers) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    stream_context->TryCancel();

    std::vector<double> all;
    for (const auto& l : lags) all.insert(all.end(), l.begin(), l.end());
    std::printf(
        "control_plane/watch: %d watchers x %d events/s injected: %.0f events/s delivered "
        "(%zu of %d), p50 lag %.2fms, p99 lag %.2fms\n",
        kWatchers, kEventsPerSecond, all.size() / seconds, all.size(), total * kWatchers,
        Quantile(all, 0.5), Quantile(all, 0.99));
  }

  // ReportEvents from 100 workers at once, each on its own connection with
  // one running rank, closed loop, each report carrying kStepsPerReport
  // steps as an agent batches them: the busiest writer of a cluster's
  // coordinator. Timed once every worker is connected, as Submit is.
  void Report() {
    auto server = StartServer("report");
    auto channel = grpc::CreateChannel(server->grpc_address(), grpc::InsecureChannelCredentials());
    auto jobs = JobService::NewStub(channel);
    auto workers = WorkerService::NewStub(channel);
    for (int w = 0; w < kReportWorkers; ++w) {
      ballast::v1::RegisterWorkerRequest reg;
      reg.set_host("127.0.0.1");
      reg.set_device_kind("cpu");
      reg.set_capacity(1);
      ballast::v1::RegisterWorkerResponse registered;
      workers->RegisterWorker(Context().get(), reg, &registered);
    }
    // Each job lands on a worker of its own; its rank is reported started.
    std::vector<std::pair<std::string, std::string>> ranks;  // (worker id, job id)
    for (int j = 0; j < kReportWorkers; ++j) {
      ballast::v1::SubmitJobRequest submit;
      *submit.mutable_spec() = spec_;
      ballast::v1::Job job;
      jobs->SubmitJob(Context().get(), submit, &job);
      ballast::v1::GetJobRequest get;
      get.set_job_id(job.id());
      jobs->GetJob(Context().get(), get, &job);
      if (job.placement_size() != 1) {
        std::fprintf(stderr, "control_plane_bench: job %s was not placed\n", job.id().c_str());
        std::exit(1);
      }
      ranks.emplace_back(job.placement(0).worker_id(), job.id());
      ballast::v1::ReportEventsRequest report;
      report.set_worker_id(ranks.back().first);
      report.set_report_id(1);
      ballast::v1::RankEvent* started = report.add_events();
      started->set_job_id(job.id());
      started->set_attempt(1);
      started->mutable_started()->set_pid(1000 + j);
      ballast::v1::ReportEventsResponse ack;
      workers->ReportEvents(Context().get(), report, &ack);
    }

    std::vector<std::vector<double>> latencies(kReportWorkers);
    std::atomic<int> failures{0};
    std::latch connected(kReportWorkers + 1);
    std::vector<std::thread> agents;
    for (int w = 0; w < kReportWorkers; ++w) {
      agents.emplace_back([&, w] {
        grpc::ChannelArguments args;
        args.SetInt("grpc.channel_id", w);
        auto own = grpc::CreateCustomChannel(server->grpc_address(),
                                             grpc::InsecureChannelCredentials(), args);
        auto stub = WorkerService::NewStub(own);
        if (!own->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
          ++failures;
        }
        connected.arrive_and_wait();
        const auto& [worker_id, job_id] = ranks[w];
        int64_t step = 0;
        for (int i = 0; i < kReportsPerWorker; ++i) {
          ballast::v1::ReportEventsRequest report;
          report.set_worker_id(worker_id);
          report.set_report_id(i + 2);
          for (int k = 0; k < kStepsPerReport; ++k) {
            ballast::v1::RankEvent* e = report.add_events();
            e->set_job_id(job_id);
            e->set_attempt(1);
            ballast::v1::StepMetrics* m = e->mutable_training()->mutable_step_metrics();
            m->set_step(++step);
            m->set_max_steps(1000000);
            m->set_loss(2.5);
            m->set_grad_norm(1.0);
            m->set_step_time_s(0.25);
          }
          ballast::v1::ReportEventsResponse ack;
          const auto start = Clock::now();
          if (!stub->ReportEvents(Context().get(), report, &ack).ok()) ++failures;
          latencies[w].push_back(Ms(Clock::now() - start));
        }
      });
    }
    connected.arrive_and_wait();
    const auto begin = Clock::now();
    for (auto& t : agents) t.join();
    const double seconds = std::chrono::duration<double>(Clock::now() - begin).count();
    std::vector<double> all;
    for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
    std::printf(
        "control_plane/report: p50=%.2fms p99=%.2fms with %d workers reporting at once, %d steps "
        "a report (%zu calls, %.0f calls/s, %.0f events/s, %d failed)\n",
        Quantile(all, 0.5), Quantile(all, 0.99), kReportWorkers, kStepsPerReport, all.size(),
        all.size() / seconds, all.size() * kStepsPerReport / seconds, failures.load());
  }

  // 1,000 running jobs of 4 ranks, each rank with its step-time histogram,
  // memory and bytes: the size of /metrics, the latency of a scrape over
  // HTTP, and per scrape encoded in this thread (as the HTTP handler does):
  // its CPU time (thread CPU clock), its allocations, and how long it keeps
  // the coordinator's lock. The lock's hold time cannot be read without a
  // probe in ballastd's code, so it is measured from outside, as any other
  // call sees it: a thread calls GetJob (which takes the lock, briefly)
  // in a loop during each scrape, and the longest call is the wait.
  void Scrape() {
    auto server = StartServer("scrape");
    auto channel = grpc::CreateChannel(server->grpc_address(), grpc::InsecureChannelCredentials());
    auto jobs = JobService::NewStub(channel);
    auto workers = WorkerService::NewStub(channel);
    std::vector<std::string> worker_ids;
    for (int w = 0; w < kScrapeJobs; ++w) {
      ballast::v1::RegisterWorkerRequest reg;
      reg.set_host("127.0.0.1");
      reg.set_device_kind("cpu");
      reg.set_capacity(kRanksPerJob);
      ballast::v1::RegisterWorkerResponse registered;
      workers->RegisterWorker(Context().get(), reg, &registered);
      worker_ids.push_back(registered.worker_id());
    }
    ballast::v1::JobSpec spec = spec_;
    spec.set_devices(kRanksPerJob);
    spec.mutable_data()->set_grad_accum_steps(kRanksPerJob);
    std::map<std::string, int64_t> report_ids;
    for (int j = 0; j < kScrapeJobs; ++j) {
      ballast::v1::SubmitJobRequest submit;
      *submit.mutable_spec() = spec;
      ballast::v1::Job job;
      jobs->SubmitJob(Context().get(), submit, &job);
      ballast::v1::GetJobRequest get;
      get.set_job_id(job.id());
      jobs->GetJob(Context().get(), get, &job);
      for (const ballast::v1::RankPlacement& p : job.placement()) {
        ballast::v1::ReportEventsRequest report;
        report.set_worker_id(p.worker_id());
        report.set_report_id(++report_ids[p.worker_id()]);
        ballast::v1::RankEvent* started = report.add_events();
        started->set_job_id(job.id());
        started->set_attempt(1);
        started->set_rank(p.rank());
        started->mutable_started()->set_pid(1000 + p.rank());
        for (int step = 1; step <= 3; ++step) {
          ballast::v1::RankEvent* e = report.add_events();
          e->set_job_id(job.id());
          e->set_attempt(1);
          e->set_rank(p.rank());
          ballast::v1::StepMetrics* m = e->mutable_training()->mutable_step_metrics();
          m->set_step(step);
          m->set_max_steps(1000000);
          m->set_loss(2.5);
          m->set_grad_norm(1.0);
          m->set_step_time_s(0.25 * step);
          m->set_peak_memory_bytes(int64_t{1} << 30);
          m->set_communicated_bytes(int64_t{1} << 24);
        }
        ballast::v1::ReportEventsResponse ack;
        workers->ReportEvents(Context().get(), report, &ack);
      }
    }
    ballast::v1::ListJobsRequest running;
    running.add_states(ballast::v1::JOB_STATE_RUNNING);
    running.set_page_size(1000);
    ballast::v1::ListJobsResponse listed;
    jobs->ListJobs(Context().get(), running, &listed);

    const std::string http = server->http_address();
    httplib::Client client(http.substr(0, http.rfind(':')),
                           std::stoi(http.substr(http.rfind(':') + 1)));
    std::vector<double> latency_ms;
    size_t bytes = 0;
    for (int i = 0; i < kScrapes; ++i) {
      const auto start = Clock::now();
      auto response = client.Get("/metrics");
      latency_ms.push_back(Ms(Clock::now() - start));
      if (!response || response->status != 200) {
        std::fprintf(stderr, "control_plane_bench: scrape failed\n");
        std::exit(1);
      }
      bytes = response->body.size();
    }
    std::vector<double> cpu_ms, allocations, allocated_mb;
    for (int i = 0; i < kScrapes; ++i) {
      timespec a{}, b{};
      t_allocations = t_allocated_bytes = 0;
      t_count_allocations = true;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      const std::string text = server->metrics()->Encode();
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      t_count_allocations = false;
      cpu_ms.push_back((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6);
      allocations.push_back(static_cast<double>(t_allocations));
      allocated_mb.push_back(t_allocated_bytes / 1e6);
    }

    // Apart from the loop above, so that the probe's calls do not slow the
    // scrapes whose CPU time it reports.
    const std::string probe_job = listed.jobs(0).id();
    std::atomic<bool> probing{true};
    std::atomic<int64_t> probe_calls{0};
    std::atomic<int64_t> longest_ns{0};
    std::thread prober([&] {
      while (probing.load()) {
        const auto start = Clock::now();
        (void)server->coordinator()->GetJob(probe_job);
        const int64_t ns = (Clock::now() - start).count();
        int64_t longest = longest_ns.load();
        while (ns > longest && !longest_ns.compare_exchange_weak(longest, ns)) {
        }
        ++probe_calls;
      }
    });
    std::vector<double> lock_ms;
    for (int i = 0; i < kScrapes; ++i) {
      longest_ns = 0;
      const std::string text = server->metrics()->Encode();
      // The call the scrape held up ends after it: wait for the next one.
      const int64_t calls = probe_calls.load();
      while (probe_calls.load() < calls + 2) std::this_thread::yield();
      lock_ms.push_back(longest_ns.load() / 1e6);
    }
    probing = false;
    prober.join();
    std::printf(
        "control_plane/scrape: %d running jobs x %d ranks (%d listed running): /metrics %.1f MB, "
        "p50 %.1fms p99 %.1fms over HTTP, %.1fms coordinator CPU per scrape, %.0f allocations "
        "(%.1f MB) per scrape, coordinator lock held %.1fms (the longest GetJob during a scrape; "
        "medians of %d scrapes)\n",
        kScrapeJobs, kRanksPerJob, listed.jobs_size(), bytes / 1e6, Quantile(latency_ms, 0.5),
        Quantile(latency_ms, 0.99), Quantile(cpu_ms, 0.5), Quantile(allocations, 0.5),
        Quantile(allocated_mb, 0.5), Quantile(lock_ms, 0.5), kScrapes);
  }

  static void Scheduler() {
    std::mt19937_64 rng(42);
    ballast::server::Scheduler s;
    for (int w = 0; w < kWorkers; ++w) s.AddWorker("w" + std::to_string(w), kDevicesPerWorker);
    const int sizes[] = {1, 1, 1, 1, 2, 2, 4, 8};
    int64_t order = 0;
    std::vector<ballast::server::Decision> running;
    auto enqueue = [&] {
      ++order;
      s.Enqueue("job-" + std::to_string(order), static_cast<int32_t>(rng() % 5) - 2, order,
                sizes[rng() % 8]);
    };
    // Fill the cluster, then keep 10,000 waiting behind it.
    while (s.free_devices() > 0 || s.queued() < static_cast<size_t>(kQueuedJobs)) {
      enqueue();
      if (s.free_devices() > 0) {
        for (auto& d : s.Schedule()) running.push_back(std::move(d));
      }
    }
    // One job finishes and one arrives per pass, as in steady operation.
    std::vector<double> pass_ms;
    int64_t started = 0;
    const auto begin = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - begin).count() < kSchedulerSeconds) {
      const size_t victim = rng() % running.size();
      for (const auto& p : running[victim].ranks) s.Release(p.worker_id(), p.device());
      running[victim] = std::move(running.back());
      running.pop_back();
      enqueue();
      const auto start = Clock::now();
      std::vector<ballast::server::Decision> decisions = s.Schedule();
      pass_ms.push_back(Ms(Clock::now() - start));
      started += static_cast<int64_t>(decisions.size());
      for (auto& d : decisions) running.push_back(std::move(d));
    }
    double busy_ms = 0;
    for (double ms : pass_ms) busy_ms += ms;
    std::printf(
        "control_plane/scheduler: %d queued x %d workers (%d devices each): %.0f decisions/s, "
        "p50 decision %.3fms, p99 decision %.3fms (%zu passes, %lld jobs started)\n",
        kQueuedJobs, kWorkers, kDevicesPerWorker, pass_ms.size() / (busy_ms / 1000),
        Quantile(pass_ms, 0.5), Quantile(pass_ms, 0.99), pass_ms.size(),
        static_cast<long long>(started));
  }

 private:
  SpecFolder folder_{"ballast-bench"};
  const ballast::v1::JobSpec spec_ = folder_.Spec(1000000);
};

}  // namespace

// With names (submit, watch, scheduler, scrape, report), runs only those.
int main(int argc, char** argv) {
  const std::vector<std::string> only(argv + 1, argv + argc);
  auto wanted = [&](const char* name) {
    return only.empty() || std::find(only.begin(), only.end(), name) != only.end();
  };
  Bench bench;
  if (wanted("submit")) bench.Submit();
  if (wanted("watch")) bench.Watch();
  if (wanted("scheduler")) Bench::Scheduler();
  if (wanted("scrape")) bench.Scrape();
  if (wanted("report")) bench.Report();
  return 0;
}
