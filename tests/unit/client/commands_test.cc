// The command layer end to end: RunCli against a real gRPC JobService served
// in-process on 127.0.0.1 (an ephemeral port), with scripted behaviour.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "client/cli.h"

namespace ballast::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kJobId[] = "job-000000000001";

// JobService with scripted answers; records what the client sent.
class FakeJobService final : public v1::JobService::Service {
 public:
  absl::Mutex mu;
  v1::Job job ABSL_GUARDED_BY(mu);
  // The job's events, seq 1..n.
  std::vector<v1::JobEvent> events ABSL_GUARDED_BY(mu);
  // Watches send events up to this seq, then holds the stream open; -1: all.
  int64_t hold_after_seq ABSL_GUARDED_BY(mu) = -1;
  // SubmitJob answers UNAVAILABLE this many times, then submit_error or OK.
  int submit_unavailable ABSL_GUARDED_BY(mu) = 0;
  grpc::Status submit_error ABSL_GUARDED_BY(mu);
  std::vector<v1::Job> listed ABSL_GUARDED_BY(mu);
  std::vector<v1::Worker> workers ABSL_GUARDED_BY(mu);

  std::vector<std::string> request_ids ABSL_GUARDED_BY(mu);
  std::vector<int64_t> watch_after_seqs ABSL_GUARDED_BY(mu);
  std::vector<std::string> authorizations ABSL_GUARDED_BY(mu);
  std::vector<int> list_states ABSL_GUARDED_BY(mu);
  int64_t sent_up_to ABSL_GUARDED_BY(mu) = 0;
  bool batched_unimplemented ABSL_GUARDED_BY(mu) = false;

  // Blocks until a watch has sent the event with `seq`; false after 10 s.
  bool AwaitSent(int64_t seq) {
    absl::MutexLock lock(&mu);
    auto sent = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) { return sent_up_to >= seq; };
    return mu.AwaitWithTimeout(absl::Condition(&sent), absl::Seconds(10));
  }

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    request_ids.push_back(request->request_id());
    if (submit_unavailable > 0) {
      --submit_unavailable;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "store busy");
    }
    if (!submit_error.ok()) return submit_error;
    *response = job;
    *response->mutable_spec() = request->spec();
    response->set_request_id(request->request_id());
    return grpc::Status::OK;
  }

  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    if (request->job_id() != job.id()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "job " + request->job_id() + " not found");
    }
    *response = job;
    return grpc::Status::OK;
  }

  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    for (int s : request->states()) list_states.push_back(s);
    // Pages of at most two, so the client has to follow next_page_token.
    const size_t start = request->page_token().empty() ? 0 : std::stoul(request->page_token());
    const size_t size = std::min<size_t>(2, request->page_size());
    for (size_t i = start; i < listed.size() && i < start + size; ++i) {
      *response->add_jobs() = listed[i];
    }
    if (start + size < listed.size()) response->set_next_page_token(std::to_string(start + size));
    return grpc::Status::OK;
  }

  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    *response = job;
    response->set_state(v1::JOB_STATE_CANCELLING);
    return grpc::Status::OK;
  }

  grpc::Status RollbackJob(grpc::ServerContext* context, const v1::RollbackJobRequest* request,
                           v1::Job* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    if (request->to_step() > job.step()) {
      return grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("to_step: must be in 0..", job.step(), ", got ", request->to_step()));
    }
    *response = job;
    response->set_state(v1::JOB_STATE_ROLLING_BACK);
    return grpc::Status::OK;
  }

  // Two events to a message, so that the client unpacks batches; or
  // UNIMPLEMENTED, as from a coordinator older than WatchJobBatched.
  grpc::Status WatchJobBatched(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                               grpc::ServerWriter<v1::WatchJobBatch>* writer) override {
    if (absl::MutexLock lock(&mu); batched_unimplemented) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "unknown method");
    }
    return Watch(context, *request, 2, [&](const std::vector<v1::JobEvent>& events) {
      v1::WatchJobBatch batch;
      for (const v1::JobEvent& e : events) *batch.add_events() = e;
      return writer->Write(batch);
    });
  }

  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override {
    return Watch(context, *request, 1,
                 [&](const std::vector<v1::JobEvent>& events) { return writer->Write(events[0]); });
  }

  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    absl::MutexLock lock(&mu);
    Record(context);
    for (const v1::Worker& w : workers) *response->add_workers() = w;
    return grpc::Status::OK;
  }

 private:
  // Sends the job's events after request.after_seq, `per_message` to a
  // message, through `write`.
  grpc::Status Watch(grpc::ServerContext* context, const v1::WatchJobRequest& request,
                     size_t per_message,
                     const std::function<bool(const std::vector<v1::JobEvent>&)>& write) {
    std::vector<v1::JobEvent> to_send;
    {
      absl::MutexLock lock(&mu);
      Record(context);
      watch_after_seqs.push_back(request.after_seq());
      if (request.job_id() != job.id()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job");
      for (const v1::JobEvent& e : events) {
        if (e.seq() <= request.after_seq()) continue;
        if (hold_after_seq >= 0 && e.seq() > hold_after_seq) break;
        to_send.push_back(e);
      }
    }
    for (size_t i = 0; i < to_send.size(); i += per_message) {
      const std::vector<v1::JobEvent> message(
          to_send.begin() + i, to_send.begin() + std::min(i + per_message, to_send.size()));
      if (!write(message)) return grpc::Status::CANCELLED;
      absl::MutexLock lock(&mu);
      sent_up_to = message.back().seq();
    }
    if (!to_send.empty() && to_send.back().has_state_change() &&
        (to_send.back().state_change().to() == v1::JOB_STATE_SUCCEEDED ||
         to_send.back().state_change().to() == v1::JOB_STATE_FAILED)) {
      return grpc::Status::OK;
    }
    // A live job: the stream stays open until the client or a shutdown ends it.
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::CANCELLED;
  }

  void Record(grpc::ServerContext* context) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = context->client_metadata().find("authorization");
    authorizations.push_back(it == context->client_metadata().end()
                                 ? ""
                                 : std::string(it->second.data(), it->second.size()));
  }
};

// One gRPC server on 127.0.0.1; `port` 0 picks a free one.
class TestServer {
 public:
  TestServer(FakeJobService* service, int port) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~TestServer() { Shutdown(); }
  // Stops at once, cancelling open streams, as a killed coordinator would.
  void Shutdown() {
    if (!server_) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
    server_.reset();
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct CliResult {
  int code;
  std::string out;
  std::string err;
};

Tuning FastTuning() {
  Tuning t;
  t.submit_backoff = absl::Milliseconds(10);
  t.reconnect_window = absl::Seconds(10);
  return t;
}

CliResult RunBallast(const std::vector<std::string>& args, Interrupt* interrupt = nullptr,
                     const Tuning& tuning = FastTuning()) {
  std::vector<const char*> argv = {"ballast"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  Interrupt local;
  const int code =
      RunCli(static_cast<int>(argv.size()), argv.data(), Io{.out = &out, .err = &err, .tty = false},
             interrupt != nullptr ? interrupt : &local, tuning);
  return {code, out.str(), err.str()};
}

v1::JobEvent StateEvent(int64_t seq, v1::JobState from, v1::JobState to, std::string reason) {
  v1::JobEvent e;
  e.set_job_id(kJobId);
  e.set_seq(seq);
  e.mutable_state_change()->set_from(from);
  e.mutable_state_change()->set_to(to);
  e.mutable_state_change()->set_reason(std::move(reason));
  return e;
}

// A step of three; nullopt `loss`: a step without supervised tokens.
v1::JobEvent StepEvent(int64_t seq, int64_t step, std::optional<double> loss) {
  v1::JobEvent e;
  e.set_job_id(kJobId);
  e.set_seq(seq);
  v1::StepMetrics* m = e.mutable_training()->mutable_step_metrics();
  m->set_step(step);
  m->set_max_steps(3);
  if (loss.has_value()) {
    m->set_loss(*loss);
    m->set_supervised_tokens(100);
  }
  m->set_grad_norm(0.5);
  m->set_lr(1e-4);
  m->set_tokens_per_s(1000);
  m->set_step_time_s(2);
  return e;
}

v1::JobEvent LogEvent(int64_t seq, std::string level, std::string text) {
  v1::JobEvent e;
  e.set_job_id(kJobId);
  e.set_seq(seq);
  v1::LogLine* log = e.mutable_training()->mutable_log();
  log->set_rank(0);
  log->set_level(std::move(level));
  log->set_text(std::move(text));
  return e;
}

// A three-step job: its six events, the last one SUCCEEDED.
std::vector<v1::JobEvent> SucceedingRun() {
  v1::JobEvent checkpoint;
  checkpoint.set_job_id(kJobId);
  checkpoint.set_seq(4);
  v1::CheckpointSaved* saved = checkpoint.mutable_training()->mutable_checkpoint_saved();
  saved->set_step(2);
  saved->set_path("/out/checkpoints/step-2");
  return {StateEvent(1, v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_RUNNING, "ranks started"),
          StepEvent(2, 1, 2.5),
          StepEvent(3, 2, 2.25),
          checkpoint,
          StepEvent(5, 3, 2.0),
          StateEvent(6, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, "all ranks exited 0")};
}

constexpr char kSucceededOutput[] =
    "state SCHEDULED -> RUNNING: ranks started\n"
    "step 1/3 loss 2.5000 grad_norm 0.5 lr 1.0e-04 tok/s 1,000 ETA 4s\n"
    "step 2/3 loss 2.2500 grad_norm 0.5 lr 1.0e-04 tok/s 1,000 ETA 2s\n"
    "checkpoint step 2: /out/checkpoints/step-2\n"
    "step 3/3 loss 2.0000 grad_norm 0.5 lr 1.0e-04 tok/s 1,000 ETA 0s\n"
    "state RUNNING -> SUCCEEDED: all ranks exited 0\n"
    "job-000000000001 SUCCEEDED\n";

constexpr char kSpec[] = R"(
name: demo
model: {path: /models/qwen3}
data: {path: data.jsonl, seq_len: 512}
max_steps: 100
)";

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("BALLAST_TOKEN");
    unsetenv("BALLAST_COORDINATOR");
    absl::MutexLock lock(&service_.mu);
    service_.job.set_id(kJobId);
    service_.job.set_state(v1::JOB_STATE_RUNNING);
    service_.job.mutable_spec()->set_name("demo");
    service_.job.mutable_spec()->set_max_steps(3);
    service_.events = SucceedingRun();
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("ballast_client_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::vector<std::string> With(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", server_.address()});
    return args;
  }

  FakeJobService service_;
  TestServer server_{&service_, 0};
  std::filesystem::path dir_;
};

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// ---- submit ----

TEST_F(CommandsTest, SubmitRetriesUnavailableWithTheSameRequestId) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.submit_unavailable = 2;
  }
  CliResult r = RunBallast(With({"submit", WriteFile("spec.yaml", kSpec)}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "submitted job-000000000001\n");
  EXPECT_THAT(r.err, HasSubstr("retrying (3/5)"));
  absl::MutexLock lock(&service_.mu);
  ASSERT_EQ(service_.request_ids.size(), 3u);
  EXPECT_EQ(service_.request_ids[1], service_.request_ids[0]);
  EXPECT_EQ(service_.request_ids[2], service_.request_ids[0]);
  EXPECT_TRUE(std::regex_match(
      service_.request_ids[0],
      std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << service_.request_ids[0];
}

TEST_F(CommandsTest, EverySubmitGetsAFreshRequestIdUnlessGiven) {
  const std::string spec = WriteFile("spec.yaml", kSpec);
  ASSERT_EQ(RunBallast(With({"submit", spec})).code, 0);
  ASSERT_EQ(RunBallast(With({"submit", spec})).code, 0);
  ASSERT_EQ(RunBallast(With({"submit", spec, "--request-id", "nightly-42"})).code, 0);
  absl::MutexLock lock(&service_.mu);
  ASSERT_EQ(service_.request_ids.size(), 3u);
  EXPECT_NE(service_.request_ids[0], service_.request_ids[1]);
  EXPECT_EQ(service_.request_ids[2], "nightly-42");
}

TEST_F(CommandsTest, SubmitGivesUpAfterItsAttemptsWithExit3) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.submit_unavailable = 100;
  }
  Tuning tuning = FastTuning();
  tuning.submit_attempts = 3;
  CliResult r = RunBallast(With({"submit", WriteFile("spec.yaml", kSpec)}), nullptr, tuning);
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("ballast: cannot reach the coordinator"));
  absl::MutexLock lock(&service_.mu);
  EXPECT_EQ(service_.request_ids.size(), 3u);
}

TEST_F(CommandsTest, SubmitShowsTheServersInvalidArgumentAndExits2) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.submit_error =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lora.r: must be in 1..4096, got 0");
  }
  CliResult r = RunBallast(With({"submit", WriteFile("spec.yaml", kSpec), "--set", "lora.r=0"}));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "ballast: lora.r: must be in 1..4096, got 0\n");
  EXPECT_EQ(r.out, "");
}

TEST_F(CommandsTest, SubmitAppliesOverridesLocallyBeforeSending) {
  CliResult r = RunBallast(With({"-o", "json", "submit", WriteFile("spec.yaml", kSpec), "--set",
                                 "max_steps=7", "--set", "name=renamed"}));
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json job = nlohmann::json::parse(r.out);
  EXPECT_EQ(job["id"], kJobId);
  EXPECT_EQ(job["spec"]["max_steps"], "7");
  EXPECT_EQ(job["spec"]["name"], "renamed");
}

TEST_F(CommandsTest, ABadLocalSpecExits2WithoutCallingTheCoordinator) {
  CliResult unknown_key = RunBallast(With({"submit", WriteFile("bad.yaml", "max_stepz: 10\n")}));
  EXPECT_EQ(unknown_key.code, 2);
  EXPECT_THAT(unknown_key.err, StartsWith("ballast: "));
  EXPECT_THAT(unknown_key.err, HasSubstr("max_stepz"));
  CliResult bad_override =
      RunBallast(With({"submit", WriteFile("spec.yaml", kSpec), "--set", "nokey"}));
  EXPECT_EQ(bad_override.code, 2);
  EXPECT_THAT(bad_override.err, HasSubstr("nokey"));
  CliResult missing = RunBallast(With({"submit", (dir_ / "missing.yaml").string()}));
  EXPECT_EQ(missing.code, 2);
  absl::MutexLock lock(&service_.mu);
  EXPECT_TRUE(service_.request_ids.empty());
}

TEST_F(CommandsTest, SubmitWaitWatchesTheJobToItsEnd) {
  CliResult r = RunBallast(With({"submit", WriteFile("spec.yaml", kSpec), "--wait"}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, std::string("submitted job-000000000001\n") + kSucceededOutput);
}

// ---- watch ----

TEST_F(CommandsTest, WatchPrintsEveryEventAndExits0OnSuccess) {
  CliResult r = RunBallast(With({"watch", kJobId}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, kSucceededOutput);
  absl::MutexLock lock(&service_.mu);
  EXPECT_THAT(service_.watch_after_seqs, ElementsAre(0));
}

// A coordinator from before WatchJobBatched: the CLI follows its WatchJob.
TEST_F(CommandsTest, WatchFollowsAnOlderCoordinatorThroughWatchJob) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.batched_unimplemented = true;
  }
  CliResult r = RunBallast(With({"watch", kJobId}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, kSucceededOutput);
  absl::MutexLock lock(&service_.mu);
  EXPECT_THAT(service_.watch_after_seqs, ElementsAre(0));
}

TEST_F(CommandsTest, WatchReconnectsAfterACoordinatorRestartAndPrintsEachEventOnce) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.hold_after_seq = 3;
  }
  CliResult r;
  std::thread cli([&] { r = RunBallast(With({"watch", kJobId})); });
  ASSERT_TRUE(service_.AwaitSent(3));
  const int port = server_.port();
  server_.Shutdown();

  // The restarted coordinator, on the same port, has the whole history.
  FakeJobService restarted;
  {
    absl::MutexLock lock(&restarted.mu);
    restarted.job.set_id(kJobId);
    restarted.job.set_state(v1::JOB_STATE_SUCCEEDED);
    restarted.events = SucceedingRun();
  }
  TestServer second(&restarted, port);
  ASSERT_EQ(second.port(), port);
  cli.join();

  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, kSucceededOutput);
  EXPECT_THAT(r.err, HasSubstr("lost the event stream"));
  {
    absl::MutexLock lock(&service_.mu);
    EXPECT_THAT(service_.watch_after_seqs, ElementsAre(0));
  }
  absl::MutexLock lock(&restarted.mu);
  EXPECT_THAT(restarted.watch_after_seqs, ElementsAre(3));
}

TEST_F(CommandsTest, WatchGivesUpWithExit3WhenTheCoordinatorStaysAway) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.hold_after_seq = 2;
  }
  Tuning tuning = FastTuning();
  tuning.reconnect_window = absl::Seconds(1);
  CliResult r;
  std::thread cli([&] { r = RunBallast(With({"watch", kJobId}), nullptr, tuning); });
  ASSERT_TRUE(service_.AwaitSent(2));
  const absl::Time lost = absl::Now();
  server_.Shutdown();
  cli.join();
  const absl::Duration waited = absl::Now() - lost;
  EXPECT_EQ(r.code, 3);
  EXPECT_THAT(r.err, HasSubstr("unreachable"));
  EXPECT_GE(waited, absl::Milliseconds(900));
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_EQ(Lines(r.out).size(), 2u) << r.out;
}

TEST_F(CommandsTest, WatchExits1OnFailureAndPrintsTheReason) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.events.resize(3);
    service_.events.push_back(
        StateEvent(4, v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED, "rank 0 exited 2"));
    service_.job.set_state(v1::JOB_STATE_FAILED);
    service_.job.set_failure_reason(
        "rank 0 exited 2: data.jsonl line 3: labels longer than input_ids");
  }
  CliResult r = RunBallast(With({"watch", kJobId}));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(Lines(r.out).back(),
            "job-000000000001 FAILED: rank 0 exited 2: data.jsonl line 3: labels longer than "
            "input_ids");
}

TEST_F(CommandsTest, WatchJsonPrintsOneEventPerLine) {
  CliResult r = RunBallast(With({"watch", kJobId, "-o", "json"}));
  EXPECT_EQ(r.code, 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 6u) << r.out;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json event = nlohmann::json::parse(lines[i]);
    EXPECT_EQ(event["seq"], std::to_string(i + 1));
    EXPECT_EQ(event["job_id"], kJobId);
  }
  EXPECT_EQ(nlohmann::json::parse(lines[2])["training"]["step_metrics"]["loss"], 2.25);
}

TEST_F(CommandsTest, AStepWithoutLossWatchesAsADashAndHasNoLossInJson) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.events = {StepEvent(1, 1, std::nullopt),
                       StateEvent(2, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, "")};
  }
  CliResult text = RunBallast(With({"watch", kJobId}));
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(Lines(text.out)[0], "step 1/3 loss - grad_norm 0.5 lr 1.0e-04 tok/s 1,000 ETA 4s");
  CliResult json = RunBallast(With({"watch", kJobId, "-o", "json"}));
  EXPECT_EQ(json.code, 0) << json.err;
  const nlohmann::json step = nlohmann::json::parse(Lines(json.out)[0])["training"]["step_metrics"];
  EXPECT_EQ(step["grad_norm"], 0.5);
  EXPECT_FALSE(step.contains("loss")) << step;
}

TEST_F(CommandsTest, WatchOfAnUnknownJobExits1) {
  CliResult r = RunBallast(With({"watch", "job-ffffffffffff"}));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.err, "ballast: job job-ffffffffffff not found\n");
}

TEST_F(CommandsTest, InterruptDuringWatchExits130) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.hold_after_seq = 2;
  }
  Interrupt interrupt;
  CliResult r;
  std::thread cli([&] { r = RunBallast(With({"watch", kJobId}), &interrupt); });
  ASSERT_TRUE(service_.AwaitSent(2));
  interrupt.Trigger();
  cli.join();
  EXPECT_EQ(r.code, 130);
  EXPECT_THAT(r.err, HasSubstr("ballast: interrupted"));
  EXPECT_THAT(r.err, HasSubstr("ballast cancel job-000000000001"));
}

// ---- logs ----

TEST_F(CommandsTest, LogsStopsAtTheLiveEdgeWithoutFollow) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.events = {LogEvent(1, "info", "loading model"), StepEvent(2, 1, 2.5),
                       LogEvent(3, "warning", "slow data loader"), LogEvent(4, "info", "step 1"),
                       // Arrived after GetJob read last_seq: beyond the edge.
                       LogEvent(5, "info", "later")};
    service_.job.set_last_seq(4);
  }
  CliResult r = RunBallast(With({"logs", kJobId}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "[rank 0] loading model\n"
            "[rank 0] warning: slow data loader\n"
            "[rank 0] step 1\n");
}

TEST_F(CommandsTest, LogsFollowRunsToTheTerminalState) {
  {
    absl::MutexLock lock(&service_.mu);
    service_.events = {LogEvent(1, "info", "a"), LogEvent(2, "error", "b"),
                       StateEvent(3, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, "")};
    service_.job.set_last_seq(1);
  }
  CliResult r = RunBallast(With({"logs", kJobId, "--follow"}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] a\n[rank 0] error: b\n");
}

// ---- the rest ----

TEST_F(CommandsTest, TheTokenTravelsAsBearerMetadata) {
  ASSERT_EQ(RunBallast(With({"get", kJobId})).code, 0);
  setenv("BALLAST_TOKEN", "s3cret", 1);
  ASSERT_EQ(RunBallast(With({"get", kJobId})).code, 0);
  absl::MutexLock lock(&service_.mu);
  EXPECT_THAT(service_.authorizations, ElementsAre("", "Bearer s3cret"));
}

TEST_F(CommandsTest, TheAddressComesFromTheEnvironment) {
  setenv("BALLAST_COORDINATOR", server_.address().c_str(), 1);
  CliResult r = RunBallast({"get", kJobId, "-o", "json"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["state"], "JOB_STATE_RUNNING");
}

TEST_F(CommandsTest, AnUnreachableCoordinatorExits3) {
  const std::string address = server_.address();
  server_.Shutdown();
  for (const char* command : {"get", "cancel", "logs"}) {
    CliResult r = RunBallast({"--coordinator", address, command, kJobId});
    EXPECT_EQ(r.code, 3) << command;
    EXPECT_THAT(r.err, StartsWith("ballast: cannot reach the coordinator at " + address));
  }
}

TEST_F(CommandsTest, ListShowsEachJobsLastLossFromListJobsAloneAndFollowsPagesUpToTheLimit) {
  {
    absl::MutexLock lock(&service_.mu);
    // Finished with a loss; requeued after a last step without one; never run.
    const int64_t steps[] = {3, 2, 0};
    const std::optional<double> losses[] = {2.0, std::nullopt, std::nullopt};
    for (int i = 0; i < 3; ++i) {
      v1::Job job;
      job.set_id(i == 0 ? kJobId : absl::StrCat("job-00000000000", i + 1));
      job.set_state(i == 0 ? v1::JOB_STATE_SUCCEEDED : v1::JOB_STATE_QUEUED);
      job.mutable_spec()->set_name(i == 0 ? "demo" : "queued-run");
      job.mutable_spec()->set_max_steps(3);
      job.set_step(steps[i]);
      job.set_last_seq(6);
      if (steps[i] > 0) {
        *job.mutable_last_step() = StepEvent(6, steps[i], losses[i]).training().step_metrics();
      }
      service_.listed.push_back(job);
    }
    // A stream per job would read these instead.
    service_.events = {StepEvent(1, 3, 9.0)};
  }
  CliResult r = RunBallast(With({"list", "--state", "succeeded", "--state", "queued"}));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(Lines(r.out),
              ElementsAre("ID                STATE      NAME        STEP  LOSS    AGE",
                          "job-000000000001  SUCCEEDED  demo        3/3   2.0000  -",
                          "job-000000000002  QUEUED     queued-run  2/3   -       -",
                          "job-000000000003  QUEUED     queued-run  0/3   -       -"));
  CliResult json = RunBallast(With({"list", "-o", "json"}));
  EXPECT_EQ(json.code, 0) << json.err;
  const nlohmann::json jobs = nlohmann::json::parse(json.out)["jobs"];
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs[0]["last_step"]["loss"], 2.0);
  EXPECT_EQ(jobs[1]["last_step"]["step"], "2");
  EXPECT_FALSE(jobs[1]["last_step"].contains("loss")) << jobs[1];
  EXPECT_FALSE(jobs[2].contains("last_step")) << jobs[2];
  CliResult limited = RunBallast(With({"list", "--limit", "1", "-o", "json"}));
  EXPECT_EQ(limited.code, 0) << limited.err;
  EXPECT_EQ(nlohmann::json::parse(limited.out)["jobs"].size(), 1u);
  absl::MutexLock lock(&service_.mu);
  // Each page's request carries the filter: two pages of the first call.
  EXPECT_THAT(service_.list_states, ElementsAre(v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_QUEUED,
                                                v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_QUEUED));
  EXPECT_TRUE(service_.watch_after_seqs.empty()) << "list opened a WatchJob stream";
}

TEST_F(CommandsTest, CancelAndRollbackPrintTheNewState) {
  CliResult cancel = RunBallast(With({"cancel", kJobId}));
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_EQ(cancel.out, "job-000000000001 CANCELLING\n");
  {
    absl::MutexLock lock(&service_.mu);
    service_.job.set_step(40);
  }
  CliResult rollback = RunBallast(With({"rollback", kJobId, "--to-step", "30"}));
  EXPECT_EQ(rollback.code, 0) << rollback.err;
  EXPECT_THAT(rollback.out, StartsWith("job-000000000001 ROLLING_BACK"));
  CliResult too_far = RunBallast(With({"rollback", kJobId, "--to-step", "50"}));
  EXPECT_EQ(too_far.code, 2);
  EXPECT_EQ(too_far.err, "ballast: to_step: must be in 0..40, got 50\n");
}

TEST_F(CommandsTest, WorkersAsTableAndJson) {
  {
    absl::MutexLock lock(&service_.mu);
    v1::Worker w;
    w.set_id("w-1");
    w.set_host("node-a");
    w.set_device_kind("cpu");
    w.set_capacity(2);
    w.set_alive(true);
    service_.workers.push_back(w);
  }
  CliResult table = RunBallast(With({"workers"}));
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_THAT(Lines(table.out), ElementsAre("ID   HOST    KIND  BUSY/CAP  ALIVE  LAST HEARTBEAT",
                                            "w-1  node-a  cpu   0/2       yes    -"));
  CliResult json = RunBallast(With({"workers", "-o", "json"}));
  const nlohmann::json doc = nlohmann::json::parse(json.out);
  ASSERT_EQ(doc["workers"].size(), 1u);
  EXPECT_EQ(doc["workers"][0]["busy"], 0);
}

TEST_F(CommandsTest, ServerTextIsEscapedInTablesAndErrorsButExactInJson) {
  const std::string forged = "w-1\x1b[2J\nw-2  node-b";
  {
    absl::MutexLock lock(&service_.mu);
    v1::Worker w;
    w.set_id(forged);
    service_.workers.push_back(w);
    service_.submit_error =
        grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "name 'a\rb\xc2\x9b' is taken");
  }
  CliResult table = RunBallast(With({"workers"}));
  EXPECT_EQ(table.code, 0) << table.err;
  EXPECT_EQ(Lines(table.out).size(), 2u) << table.out;
  EXPECT_THAT(table.out, HasSubstr("w-1\\x1b[2J\\x0aw-2  node-b"));
  CliResult json = RunBallast(With({"workers", "-o", "json"}));
  EXPECT_EQ(nlohmann::json::parse(json.out)["workers"][0]["id"], forged);
  CliResult refused = RunBallast(With({"submit", WriteFile("spec.yaml", kSpec)}));
  EXPECT_EQ(refused.code, 2);
  EXPECT_EQ(refused.err, "ballast: name 'a\\x0db\\u009b' is taken\n");
}

TEST_F(CommandsTest, UsageErrorsExit2) {
  EXPECT_EQ(RunBallast({}).code, 2);
  EXPECT_EQ(RunBallast({"get"}).code, 2);
  EXPECT_EQ(RunBallast({"rollback", kJobId}).code, 2);
  EXPECT_EQ(RunBallast({"list", "--limit", "0"}).code, 2);
  EXPECT_EQ(RunBallast({"get", kJobId, "-o", "yaml"}).code, 2);
  CliResult unknown = RunBallast({"frobnicate"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, StartsWith("ballast: "));
  CliResult bad_state = RunBallast(With({"list", "--state", "done"}));
  EXPECT_EQ(bad_state.code, 2);
  EXPECT_THAT(bad_state.err, HasSubstr("--state"));
  CliResult version = RunBallast({"--version"});
  EXPECT_EQ(version.code, 0);
  EXPECT_THAT(version.out, StartsWith("ballast "));
}

}  // namespace
}  // namespace ballast::client
