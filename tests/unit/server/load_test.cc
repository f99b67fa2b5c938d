// ballastd under load, in one process over real loopback gRPC: correctness,
// not speed (bench/control_plane_bench.cc measures that). A thousand
// concurrent submissions and two hundred watchers while workers report
// up to 5,000 events/s: every acknowledged job is stored, and every watcher sees
// its job's events with no gap and no duplicate, to the end.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "server/ballastd.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using Clock = std::chrono::steady_clock;
using testing::TempDir;
using testing::ValidSpec;

constexpr int kWorkers = 10;
constexpr int kDevicesPerWorker = 10;  // one running, watched job per device
constexpr int kWatchersPerJob = 2;     // one from the start, one joining mid-stream
constexpr int kSubmissions = 1000;
constexpr int kReportsPerSecond = 50;  // per worker, one step of each of its jobs
// Reports per worker, at least: 4 s at that pace, and on until every
// submission is answered. A count, not a duration, so that a loaded machine
// (CI runs two tests per core) sends as many events, only more slowly.
constexpr int kReportsPerWorker = 200;

std::unique_ptr<grpc::ClientContext> Context(int seconds = 60) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  return context;
}

// One watcher's stream: the seqs it saw and whether it reached the end.
struct Watched {
  std::vector<int64_t> seqs;
  int64_t steps = 0;
  bool succeeded = false;
  grpc::Status status;
};

Watched WatchToTheEnd(v1::JobService::Stub* jobs, const std::string& job_id) {
  Watched w;
  auto context = Context();
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto stream = jobs->WatchJobBatched(context.get(), request);
  v1::WatchJobBatch batch;
  while (stream->Read(&batch)) {
    for (const v1::JobEvent& e : batch.events()) {
      w.seqs.push_back(e.seq());
      w.steps += e.training().has_step_metrics() ? 1 : 0;
      w.succeeded = e.state_change().to() == v1::JOB_STATE_SUCCEEDED;
    }
  }
  w.status = stream->Finish();
  return w;
}

TEST(Load, ThousandSubmissionsAndTwoHundredWatchersWhileWorkersReportLoseNothing) {
  TempDir dir;
  const std::string db = (dir.path() / "ballastd.db").string();
  BallastdOptions o;
  o.listen = "127.0.0.1:0";
  o.http = "127.0.0.1:0";
  o.store_url = "sqlite:" + db;
  o.output_root = (dir.path() / "jobs").string();
  auto server = Ballastd::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->grpc_address(), grpc::InsecureChannelCredentials());
  auto jobs = v1::JobService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir.path());

  // Workers, and the jobs that fill them: those are watched and reported on.
  std::vector<std::string> worker_ids;
  std::vector<std::unique_ptr<grpc::ClientContext>> stream_contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::Assignment>>> streams;
  for (int w = 0; w < kWorkers; ++w) {
    v1::RegisterWorkerRequest reg;
    reg.set_host("127.0.0.1");
    reg.set_device_kind("cpu");
    reg.set_capacity(kDevicesPerWorker);
    v1::RegisterWorkerResponse registered;
    ASSERT_TRUE(workers->RegisterWorker(Context().get(), reg, &registered).ok());
    worker_ids.push_back(registered.worker_id());
    stream_contexts.push_back(Context());
    v1::StreamAssignmentsRequest request;
    request.set_worker_id(registered.worker_id());
    streams.push_back(workers->StreamAssignments(stream_contexts.back().get(), request));
  }
  for (int j = 0; j < kWorkers * kDevicesPerWorker; ++j) {
    v1::Job job;
    ASSERT_TRUE(jobs->SubmitJob(Context().get(), submit, &job).ok());
  }
  // By worker: the start assignment of each rank it runs.
  std::vector<std::vector<v1::Assignment>> running(kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    while (static_cast<int>(running[w].size()) < kDevicesPerWorker) {
      v1::Assignment a;
      ASSERT_TRUE(streams[w]->Read(&a));
      ASSERT_EQ(a.action(), v1::Assignment::ACTION_START);
      running[w].push_back(a);
    }
  }

  std::map<std::string, Watched> watched[kWatchersPerJob];
  for (auto& m : watched) {
    for (const auto& ranks : running) {
      for (const v1::Assignment& a : ranks) m[a.job_id()];
    }
  }
  std::vector<std::thread> watchers;
  auto watch_all = [&](std::map<std::string, Watched>* into) {
    for (auto& [job_id, result] : *into) {
      watchers.emplace_back(
          [&, id = job_id, out = &result] { *out = WatchToTheEnd(jobs.get(), id); });
    }
  };
  watch_all(&watched[0]);

  // Reporters: every worker, one step of each of its jobs per report.
  std::atomic<bool> submitting{true};
  std::map<std::string, int64_t> steps_reported;
  std::vector<std::map<std::string, int64_t>> steps_by_worker(kWorkers);
  std::atomic<int> report_failures{0};
  std::vector<std::thread> reporters;
  const Clock::time_point reporting_start = Clock::now();
  for (int w = 0; w < kWorkers; ++w) {
    reporters.emplace_back([&, w] {
      int64_t report_id = 0;
      int64_t step = 0;
      const auto period = std::chrono::microseconds(1000000 / kReportsPerSecond);
      auto send = [&](bool exit) {
        v1::ReportEventsRequest report;
        report.set_worker_id(worker_ids[w]);
        report.set_report_id(++report_id);
        for (const v1::Assignment& a : running[w]) {
          v1::RankEvent* e = report.add_events();
          e->set_job_id(a.job_id());
          e->set_attempt(a.attempt());
          if (exit) {
            e->mutable_exited()->set_exit_code(0);
          } else {
            e->mutable_training()->mutable_step_metrics()->set_step(step);
          }
        }
        v1::ReportEventsResponse ack;
        // At least once, as a worker does: resend until acknowledged.
        while (!workers->ReportEvents(Context().get(), report, &ack).ok()) ++report_failures;
      };
      for (auto next = Clock::now(); step < kReportsPerWorker || submitting.load();
           next += period) {
        ++step;
        send(false);
        for (const v1::Assignment& a : running[w]) ++steps_by_worker[w][a.job_id()];
        std::this_thread::sleep_until(next + period);
      }
      send(true);
    });
  }

  // A thousand submissions at once, while the reports flow.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  watch_all(&watched[1]);
  struct Call {
    grpc::ClientContext context;
    v1::Job job;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::Job>> reader;
  };
  grpc::CompletionQueue cq;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < kSubmissions; ++i) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::SubmitJobRequest request = submit;
    request.set_request_id("load-" + std::to_string(i));
    call->reader = jobs->AsyncSubmitJob(&call->context, request, &cq);
    call->reader->Finish(&call->job, &call->status, call.get());
    calls.push_back(std::move(call));
  }
  for (int i = 0; i < kSubmissions; ++i) {
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    ASSERT_TRUE(ok);
  }
  submitting = false;
  for (std::thread& t : reporters) t.join();
  const double reporting_s = std::chrono::duration<double>(Clock::now() - reporting_start).count();
  for (std::thread& t : watchers) t.join();
  for (const auto& by_job : steps_by_worker) steps_reported.insert(by_job.begin(), by_job.end());

  // Every acknowledged job is committed: a second connection, which sees
  // only committed transactions, finds it.
  auto reader = Store::Open("sqlite:" + db);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto stored = (*reader)->LoadJobs();
  ASSERT_TRUE(stored.ok()) << stored.status();
  std::map<std::string, v1::JobState> stored_ids;
  for (const JobRecord& r : *stored) stored_ids[r.job.id()] = r.job.state();
  int acked = 0;
  for (const auto& call : calls) {
    ASSERT_TRUE(call->status.ok()) << call->status.error_message();
    ++acked;
    EXPECT_EQ(stored_ids.count(call->job.id()), 1u) << call->job.id();
  }
  EXPECT_EQ(acked, kSubmissions);

  // Every watcher: seq 1, 2, 3, ... to the terminal state change, with each
  // reported step once.
  for (const auto& by_job : watched) {
    for (const auto& [job_id, w] : by_job) {
      ASSERT_TRUE(w.status.ok()) << job_id << ": " << w.status.error_message();
      ASSERT_FALSE(w.seqs.empty()) << job_id;
      for (size_t i = 0; i < w.seqs.size(); ++i) {
        ASSERT_EQ(w.seqs[i], static_cast<int64_t>(i + 1)) << job_id << " event " << i;
      }
      EXPECT_TRUE(w.succeeded) << job_id;
      EXPECT_EQ(w.steps, steps_reported.at(job_id)) << job_id;
    }
  }
  // The rate is the machine's (bench/control_plane_bench.cc measures it);
  // recorded, not asserted.
  int64_t steps = 0;
  for (const auto& [job_id, n] : steps_reported) steps += n;
  ASSERT_GE(steps, kWorkers * kDevicesPerWorker * kReportsPerWorker);
  ::testing::Test::RecordProperty("step_events_per_second", static_cast<int>(steps / reporting_s));
  for (auto& c : stream_contexts) c->TryCancel();
}

}  // namespace
}  // namespace ballast::server
