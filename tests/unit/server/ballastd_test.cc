// ballastd end to end in one process: real gRPC and HTTP over loopback.
#include "server/ballastd.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/token_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "tests/unit/server/grpc_health.h"
#include "tests/unit/server/postgres_server.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using testing::PostgresServer;
using testing::TempDir;
using testing::ValidSpec;

class BallastdTest : public ::testing::Test {
 protected:
  // A ballastd on loopback with its store in dir_.
  BallastdOptions LocalOptions() {
    BallastdOptions o;
    o.listen = "127.0.0.1:0";
    o.http = "127.0.0.1:0";
    o.store_url = "sqlite:" + (dir_.path() / "ballastd.db").string();
    o.output_root = (dir_.path() / "jobs").string();
    return o;
  }

  void Start(const std::string& token = "", std::map<std::string, TenantQuota> quotas = {}) {
    BallastdOptions o = LocalOptions();
    o.quotas = std::move(quotas);
    o.token = token;
    Start(o);
  }

  void Start(const BallastdOptions& o) {
    auto d = Ballastd::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    server_ = std::move(*d);
    auto channel = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    workers_ = v1::WorkerService::NewStub(channel);
    tokens_ = v1::TokenService::NewStub(channel);
  }

  // A token's secret, made with the admin token `admin`.
  std::string MakeToken(const std::string& admin, v1::Role role, const std::string& tenant,
                        const std::string& worker_id = "") {
    v1::CreateTokenRequest request;
    request.set_role(role);
    request.set_tenant(tenant);
    request.set_worker_id(worker_id);
    v1::CreateTokenResponse created;
    grpc::Status s = tokens_->CreateToken(Context(admin).get(), request, &created);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return created.secret();
  }

  static v1::RegisterWorkerRequest CpuWorker(int capacity) {
    v1::RegisterWorkerRequest reg;
    reg.set_host("127.0.0.1");
    reg.set_device_kind("cpu");
    reg.set_capacity(capacity);
    return reg;
  }

  // A context with a deadline, so a broken server fails the test instead of
  // hanging it.
  static std::unique_ptr<grpc::ClientContext> Context(const std::string& token = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  std::string HttpGet(const std::string& path, int* status) {
    const HttpAnswer answer = Http("GET", path);
    *status = answer.status;
    return answer.body;
  }

  struct HttpAnswer {
    int status = -1;  // -1: no answer
    httplib::Headers headers;
    std::string body;
    std::string header(const std::string& name) const {
      auto it = headers.find(name);
      return it == headers.end() ? "" : it->second;
    }
  };

  // `method` `path` on ballastd's HTTP address, with `token` as the bearer
  // (none when empty). An event stream is read up to its first event only,
  // as it would not end for 25 s.
  HttpAnswer Http(const std::string& method, const std::string& path, const std::string& token = "",
                  httplib::Headers headers = {}) {
    const size_t colon = server_->http_address().rfind(':');
    httplib::Client client(server_->http_address().substr(0, colon),
                           std::stoi(server_->http_address().substr(colon + 1)));
    client.set_read_timeout(10, 0);
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    HttpAnswer answer;
    httplib::Request request;
    request.method = method;
    request.path = path;
    request.headers = std::move(headers);
    request.response_handler = [&](const httplib::Response& response) {
      answer.status = response.status;
      answer.headers = response.headers;
      return true;
    };
    request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
      answer.body.append(data, size);
      return answer.header("Content-Type") != "text/event-stream" ||
             answer.body.find("\n\n") == std::string::npos;
    };
    httplib::Result result = client.send(request);
    // A HEAD answer has no body, so neither hook runs for it.
    if (answer.status == -1 && result) {
      answer.status = result->status;
      answer.headers = result->headers;
    }
    return answer;
  }

  TempDir dir_;
  std::unique_ptr<Ballastd> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::TokenService::Stub> tokens_;
};

TEST_F(BallastdTest, SubmitGetAndBadInputOverGrpc) {
  Start();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  submit.set_request_id("r-1");
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
  EXPECT_EQ(job.state(), v1::JOB_STATE_QUEUED);

  v1::Job again;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &again).ok());
  EXPECT_EQ(again.id(), job.id());

  submit.mutable_spec()->mutable_optimizer()->set_lr(-1);
  submit.clear_request_id();
  grpc::Status bad = jobs_->SubmitJob(Context().get(), submit, &again);
  EXPECT_EQ(bad.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(bad.error_message(), HasSubstr("optimizer.lr"));

  v1::GetJobRequest get;
  get.set_job_id("job-ffffffffffff");
  EXPECT_EQ(jobs_->GetJob(Context().get(), get, &again).error_code(), grpc::NOT_FOUND);
}

// --store postgresql://: what ballastd stored is there after a restart, and
// a request_id is still that job's.
TEST_F(BallastdTest, JobsOnPostgresqlSurviveARestart) {
  absl::StatusOr<std::string> url = PostgresServer::NewSharedDatabase();
  if (absl::IsNotFound(url.status())) GTEST_SKIP() << url.status().message();
  ASSERT_TRUE(url.ok()) << url.status();
  BallastdOptions o = LocalOptions();
  o.store_url = *url;
  Start(o);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    submit.set_request_id(absl::StrCat("r-", i));
    v1::Job job;
    ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
    ids.push_back(job.id());
  }
  v1::CancelJobRequest cancel;
  cancel.set_job_id(ids[1]);
  v1::Job cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());

  server_.reset();
  Start(o);
  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list).ok());
  std::vector<std::string> listed;
  for (const v1::Job& j : list.jobs()) {
    listed.push_back(j.id());
    EXPECT_EQ(j.state(), j.id() == ids[1] ? v1::JOB_STATE_CANCELLED : v1::JOB_STATE_QUEUED)
        << j.id();
  }
  std::sort(listed.begin(), listed.end());
  std::vector<std::string> want = ids;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(listed, want);
  submit.set_request_id("r-3");
  v1::Job again;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &again).ok());
  EXPECT_EQ(again.id(), ids[3]);
}

TEST_F(BallastdTest, AnUnreachableStoreStopsTheStartNamingItWithoutThePassword) {
  BallastdOptions o = LocalOptions();
  o.store_url = "postgresql://ballast:hunter2@127.0.0.1:1/ballast?connect_timeout=5";
  auto d = Ballastd::Start(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(d.status().message(), HasSubstr("postgresql://ballast:***@127.0.0.1:1/ballast"));
  EXPECT_THAT(d.status().message(), ::testing::Not(HasSubstr("hunter2")));
}

TEST_F(BallastdTest, SubmitRefusesAnUnsupportedModelTypeWithInvalidArgument) {
  Start();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  std::ofstream(dir_.path() / "model" / "config.json")
      << R"({"model_type": "mixtral", "max_position_embeddings": 2048})";
  v1::Job job;
  grpc::Status refused = jobs_->SubmitJob(Context().get(), submit, &job);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("model_type 'mixtral'"));
  EXPECT_THAT(refused.error_message(), HasSubstr("allowed: llama, qwen2, qwen3, sdar"));
  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
}

TEST_F(BallastdTest, MessageAboveFourMebibytesIsResourceExhausted) {
  Start();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  submit.mutable_spec()->set_name(std::string(kMaxReceiveMessageBytes + 1, 'x'));
  v1::Job job;
  EXPECT_EQ(jobs_->SubmitJob(Context().get(), submit, &job).error_code(), grpc::RESOURCE_EXHAUSTED);
  // And the server still answers.
  v1::ListJobsResponse list;
  EXPECT_TRUE(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list).ok());
}

TEST_F(BallastdTest, TokenIsRequiredWhenSet) {
  Start("s3cret");
  v1::ListJobsResponse list;
  EXPECT_EQ(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list).error_code(),
            grpc::UNAUTHENTICATED);
  EXPECT_EQ(jobs_->ListJobs(Context("wrong").get(), v1::ListJobsRequest(), &list).error_code(),
            grpc::UNAUTHENTICATED);
  EXPECT_TRUE(jobs_->ListJobs(Context("s3cret").get(), v1::ListJobsRequest(), &list).ok());
}

TEST_F(BallastdTest, WithoutATokenOnlyLoopbackAddressesAreServed) {
  BallastdOptions o = LocalOptions();
  o.listen = "0.0.0.0:0";
  auto refused = Ballastd::Start(o);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--listen 0.0.0.0:0 is reachable from other machines, and no "
                        "BALLAST_TOKEN is set"));
  o.listen = "[::1]:0";
  o.http = "10.1.2.3:0";
  EXPECT_THAT(Ballastd::Start(o).status().message(), HasSubstr("--http 10.1.2.3:0 is reachable"));
  o.http = "localhost:0";
  o.token = "s3cret";
  o.listen = "0.0.0.0:0";
  EXPECT_TRUE(Ballastd::Start(o).ok());
}

TEST_F(BallastdTest, RetentionFlagsOutOfRangeAreRefusedNamingTheFlag) {
  BallastdOptions o = LocalOptions();
  o.job_history = -1;
  EXPECT_THAT(Ballastd::Start(o).status().message(),
              HasSubstr("--job-history: -1; allowed 0 (keep every job) or more"));
  o.job_history = 0;
  o.event_retention = 0;
  EXPECT_THAT(Ballastd::Start(o).status().message(),
              HasSubstr("--event-retention: 0; allowed 1 or more"));
  o.event_retention = 10;
  o.job_history = 5;
  EXPECT_TRUE(Ballastd::Start(o).ok());
}

TEST_F(BallastdTest, WithATokenMetricsWantItAndHealthzStaysOpen) {
  Start("s3cret");
  int status = 0;
  EXPECT_THAT(HttpGet("/metrics", &status), HasSubstr("no token"));
  EXPECT_EQ(status, 401);
  EXPECT_EQ(HttpGet("/healthz", &status), "ok\n");
  EXPECT_EQ(status, 200);
  const size_t colon = server_->http_address().rfind(':');
  httplib::Client client(server_->http_address().substr(0, colon),
                         std::stoi(server_->http_address().substr(colon + 1)));
  auto response = client.Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_THAT(response->body, HasSubstr("ballast_build_info"));
}

TEST_F(BallastdTest, HealthzAndMetricsOverHttp) {
  Start();
  v1::GetJobRequest get;
  get.set_job_id("job-ffffffffffff");
  v1::Job job;
  ASSERT_EQ(jobs_->GetJob(Context().get(), get, &job).error_code(), grpc::NOT_FOUND);
  int status = 0;
  EXPECT_EQ(HttpGet("/healthz", &status), "ok\n");
  EXPECT_EQ(status, 200);
  const std::string metrics = HttpGet("/metrics", &status);
  EXPECT_EQ(status, 200);
  // prometheus-cpp prints a family's labels sorted by name.
  EXPECT_THAT(metrics,
              HasSubstr("ballast_grpc_requests_total{code=\"NOT_FOUND\",method=\"GetJob\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("# TYPE ballast_scheduler_decision_seconds histogram\n"));
  EXPECT_THAT(metrics, HasSubstr("ballast_build_info{commit=\""));
  EXPECT_THAT(metrics, HasSubstr(",version=\""));
}

TEST_F(BallastdTest, HealthServiceAnswersServing) {
  Start();
  EXPECT_EQ(testing::HealthStatus(server_->grpc_address()), 1)
      << "HealthCheckResponse{status: SERVING}";
}

TEST_F(BallastdTest, WorkerRunsAJobWhileAWatcherSeesItToTheEnd) {
  Start();
  v1::RegisterWorkerRequest reg;
  reg.set_host("127.0.0.1");
  reg.set_device_kind("cpu");
  reg.set_capacity(1);
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(workers_->RegisterWorker(Context().get(), reg, &registered).ok());
  EXPECT_EQ(registered.heartbeat_interval_ms(), registered.lease_ms() / 3);

  auto stream_context = Context();
  v1::StreamAssignmentsRequest stream_request;
  stream_request.set_worker_id(registered.worker_id());
  auto assignments = workers_->StreamAssignments(stream_context.get(), stream_request);

  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
  v1::Assignment start;
  ASSERT_TRUE(assignments->Read(&start));
  EXPECT_EQ(start.action(), v1::Assignment::ACTION_START);
  EXPECT_EQ(start.job_id(), job.id());

  auto watch_context = Context();
  v1::WatchJobRequest watch_request;
  watch_request.set_job_id(job.id());
  auto watch = jobs_->WatchJob(watch_context.get(), watch_request);

  v1::ReportEventsRequest report;
  report.set_worker_id(registered.worker_id());
  report.set_report_id(1);
  for (int step = 1; step <= 3; ++step) {
    v1::RankEvent* e = report.add_events();
    e->set_job_id(job.id());
    e->set_attempt(start.attempt());
    e->mutable_training()->mutable_step_metrics()->set_step(step);
  }
  v1::RankEvent* exit = report.add_events();
  exit->set_job_id(job.id());
  exit->set_attempt(start.attempt());
  exit->mutable_exited()->set_exit_code(0);
  v1::ReportEventsResponse ack;
  ASSERT_TRUE(workers_->ReportEvents(Context().get(), report, &ack).ok());
  EXPECT_EQ(ack.acked_report_id(), 1);

  std::vector<v1::JobEvent> events;
  v1::JobEvent e;
  while (watch->Read(&e)) events.push_back(e);
  EXPECT_TRUE(watch->Finish().ok());
  ASSERT_FALSE(events.empty());
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq(), int64_t(i + 1));
  EXPECT_EQ(events.back().state_change().to(), v1::JOB_STATE_SUCCEEDED);

  // The batched watch replays the same events, in order, several to a
  // message and none empty.
  auto batched_context = Context();
  auto batched = jobs_->WatchJobBatched(batched_context.get(), watch_request);
  std::vector<v1::JobEvent> replayed;
  v1::WatchJobBatch batch;
  int messages = 0;
  while (batched->Read(&batch)) {
    ++messages;
    EXPECT_GT(batch.events_size(), 0);
    replayed.insert(replayed.end(), batch.events().begin(), batch.events().end());
  }
  EXPECT_TRUE(batched->Finish().ok());
  ASSERT_EQ(replayed.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(replayed[i], events[i])) << i;
  }
  EXPECT_LT(messages, static_cast<int>(events.size()));
  stream_context->TryCancel();
}

TEST_F(BallastdTest, ShutdownEndsOpenStreams) {
  Start();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &job).ok());
  auto watch_context = Context();
  v1::WatchJobRequest watch_request;
  watch_request.set_job_id(job.id());
  auto watch = jobs_->WatchJob(watch_context.get(), watch_request);
  v1::JobEvent e;
  ASSERT_TRUE(watch->Read(&e));  // the stream is up
  const auto begin = std::chrono::steady_clock::now();
  server_->Shutdown();
  while (watch->Read(&e)) {
  }
  EXPECT_EQ(watch->Finish().error_code(), grpc::UNAVAILABLE);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(3));
}

}  // namespace
}  // namespace ballast::server

namespace ballast::server {
namespace {

TEST_F(BallastdTest, ATenantSeesOnlyItsOwnJobsAndAnotherTenantsIsNotFound) {
  Start("boot");
  const std::string alice = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string bob = MakeToken("boot", v1::ROLE_USER, "team-b");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  submit.set_request_id("same-key");
  v1::Job a_job, b_job;
  ASSERT_TRUE(jobs_->SubmitJob(Context(alice).get(), submit, &a_job).ok());
  EXPECT_EQ(a_job.tenant(), "team-a");
  // The same idempotency key in another tenant is another job.
  ASSERT_TRUE(jobs_->SubmitJob(Context(bob).get(), submit, &b_job).ok());
  EXPECT_NE(b_job.id(), a_job.id());

  v1::GetJobRequest get;
  get.set_job_id(a_job.id());
  v1::Job seen;
  grpc::Status hidden = jobs_->GetJob(Context(bob).get(), get, &seen);
  EXPECT_EQ(hidden.error_code(), grpc::NOT_FOUND);
  EXPECT_EQ(hidden.error_message(), "job " + a_job.id() + " not found");
  v1::CancelJobRequest cancel;
  cancel.set_job_id(a_job.id());
  EXPECT_EQ(jobs_->CancelJob(Context(bob).get(), cancel, &seen).error_code(), grpc::NOT_FOUND);
  v1::RollbackJobRequest rollback;
  rollback.set_job_id(a_job.id());
  EXPECT_EQ(jobs_->RollbackJob(Context(bob).get(), rollback, &seen).error_code(), grpc::NOT_FOUND);
  v1::WatchJobRequest watch;
  watch.set_job_id(a_job.id());
  auto watch_context = Context(bob);
  auto stream = jobs_->WatchJob(watch_context.get(), watch);
  v1::JobEvent event;
  EXPECT_FALSE(stream->Read(&event));
  EXPECT_EQ(stream->Finish().error_code(), grpc::NOT_FOUND);

  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(Context(bob).get(), v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), b_job.id());
  ASSERT_TRUE(jobs_->ListJobs(Context("boot").get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 2);
  ASSERT_TRUE(jobs_->GetJob(Context(alice).get(), get, &seen).ok());
  // The dashboard's API answers alike.
  const size_t colon = server_->http_address().rfind(':');
  httplib::Client http(server_->http_address().substr(0, colon),
                       std::stoi(server_->http_address().substr(colon + 1)));
  auto response = http.Get("/api/v1/jobs/" + a_job.id(), {{"Authorization", "Bearer " + bob}});
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 404);
  response = http.Get("/api/v1/jobs", {{"Authorization", "Bearer " + bob}});
  ASSERT_TRUE(response);
  EXPECT_THAT(response->body, HasSubstr(b_job.id()));
  EXPECT_THAT(response->body, ::testing::Not(HasSubstr(a_job.id())));
  // /metrics names every tenant's jobs: admins only. Bob's token is valid,
  // so the answer is 403, not the 401 of a bad token.
  response = http.Get("/metrics", {{"Authorization", "Bearer " + bob}});
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 403);
  EXPECT_THAT(response->body, HasSubstr("an admin token"));
}

TEST_F(BallastdTest, RolesKeepUsersOutOfTheWorkerApiAndWorkersOutOfJobsAndTokens) {
  Start("boot");
  const std::string user = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string worker = MakeToken("boot", v1::ROLE_WORKER, "", "node-1");
  v1::RegisterWorkerResponse registered;
  EXPECT_EQ(workers_->RegisterWorker(Context(user).get(), CpuWorker(1), &registered).error_code(),
            grpc::PERMISSION_DENIED);
  v1::ListJobsResponse list;
  EXPECT_EQ(jobs_->ListJobs(Context(worker).get(), v1::ListJobsRequest(), &list).error_code(),
            grpc::PERMISSION_DENIED);
  v1::ListTokensResponse tokens;
  EXPECT_EQ(tokens_->ListTokens(Context(user).get(), v1::ListTokensRequest(), &tokens).error_code(),
            grpc::PERMISSION_DENIED);
  ASSERT_TRUE(tokens_->ListTokens(Context("boot").get(), v1::ListTokensRequest(), &tokens).ok());
  EXPECT_EQ(tokens.tokens_size(), 2);

  // Revoked: refused at once.
  v1::RevokeTokenRequest revoke;
  revoke.set_id(tokens.tokens(0).id());
  v1::Token revoked;
  ASSERT_TRUE(tokens_->RevokeToken(Context("boot").get(), revoke, &revoked).ok());
  EXPECT_EQ(jobs_->ListJobs(Context(user).get(), v1::ListJobsRequest(), &list).error_code(),
            grpc::UNAUTHENTICATED);
}

// The spoofing the hostile sweep found: with only a shared token, anyone
// could report as a real worker and freeze its job with a huge report_id.
TEST_F(BallastdTest, AWorkerTokenActsOnlyAsItsOwnWorkerForItsOwnRanks) {
  Start("boot");
  const std::string node1 = MakeToken("boot", v1::ROLE_WORKER, "", "node-1");
  const std::string node2 = MakeToken("boot", v1::ROLE_WORKER, "", "node-2");
  v1::RegisterWorkerResponse one, two;
  ASSERT_TRUE(workers_->RegisterWorker(Context(node1).get(), CpuWorker(1), &one).ok());
  EXPECT_EQ(one.worker_id(), "node-1");

  auto stream_context = Context(node1);
  v1::StreamAssignmentsRequest stream_request;
  stream_request.set_worker_id("node-1");
  auto assignments = workers_->StreamAssignments(stream_context.get(), stream_request);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context("boot").get(), submit, &job).ok());
  v1::Assignment start;
  ASSERT_TRUE(assignments->Read(&start));
  ASSERT_EQ(start.job_id(), job.id());
  // Naming node-1 as its previous id does not make node-2 node-1.
  v1::RegisterWorkerRequest as_other = CpuWorker(1);
  as_other.set_previous_worker_id("node-1");
  ASSERT_TRUE(workers_->RegisterWorker(Context(node2).get(), as_other, &two).ok());
  EXPECT_EQ(two.worker_id(), "node-2");

  // node-2 cannot speak as node-1, in any call.
  v1::HeartbeatRequest beat;
  beat.set_worker_id("node-1");
  v1::HeartbeatResponse beat_response;
  EXPECT_EQ(workers_->Heartbeat(Context(node2).get(), beat, &beat_response).error_code(),
            grpc::PERMISSION_DENIED);
  v1::ReportEventsRequest forged;
  forged.set_worker_id("node-1");
  forged.set_report_id(int64_t{1} << 62);
  v1::RankEvent* e = forged.add_events();
  e->set_job_id(job.id());
  e->set_attempt(start.attempt());
  e->mutable_training()->mutable_step_metrics()->set_step(248);
  v1::ReportEventsResponse ack;
  grpc::Status denied = workers_->ReportEvents(Context(node2).get(), forged, &ack);
  EXPECT_EQ(denied.error_code(), grpc::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("belongs to worker node-2"));
  // As itself, node-2's report of node-1's rank changes nothing.
  forged.set_worker_id("node-2");
  forged.set_report_id(1);
  ASSERT_TRUE(workers_->ReportEvents(Context(node2).get(), forged, &ack).ok());
  // Even node-1 (or an admin) cannot push its report ids a day ahead.
  forged.set_worker_id("node-1");
  forged.set_report_id(int64_t{1} << 62);
  EXPECT_EQ(workers_->ReportEvents(Context(node1).get(), forged, &ack).error_code(),
            grpc::INVALID_ARGUMENT);
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job seen;
  ASSERT_TRUE(jobs_->GetJob(Context("boot").get(), get, &seen).ok());
  EXPECT_EQ(seen.step(), 0);
  // node-1's own report lands.
  forged.set_report_id(2);
  forged.mutable_events(0)->mutable_training()->mutable_step_metrics()->set_step(3);
  ASSERT_TRUE(workers_->ReportEvents(Context(node1).get(), forged, &ack).ok());
  ASSERT_TRUE(jobs_->GetJob(Context("boot").get(), get, &seen).ok());
  EXPECT_EQ(seen.step(), 3);
  stream_context->TryCancel();
}

TEST_F(BallastdTest, QuotasRefuseWhatCouldNeverRunAndHoldWhatMustWait) {
  Start("boot", {{"team-a", TenantQuota{.max_devices = 1, .max_queued_jobs = 2}}});
  const std::string alice = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string bob = MakeToken("boot", v1::ROLE_USER, "team-b");
  v1::RegisterWorkerResponse registered;
  ASSERT_TRUE(workers_->RegisterWorker(Context("boot").get(), CpuWorker(4), &registered).ok());
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  submit.mutable_spec()->set_devices(2);
  submit.mutable_spec()->mutable_data()->set_grad_accum_steps(2);
  v1::Job job;
  grpc::Status refused = jobs_->SubmitJob(Context(alice).get(), submit, &job);
  EXPECT_EQ(refused.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant team-a's quota max_devices is 1"));
  // team-b has no quota.
  ASSERT_TRUE(jobs_->SubmitJob(Context(bob).get(), submit, &job).ok());

  // One device at a time: the first runs, the next two wait, a fourth is refused.
  submit.mutable_spec()->set_devices(1);
  std::vector<v1::Job> mine(3);
  for (v1::Job& j : mine) ASSERT_TRUE(jobs_->SubmitJob(Context(alice).get(), submit, &j).ok());
  v1::GetJobRequest get;
  std::vector<v1::JobState> states;
  for (const v1::Job& j : mine) {
    get.set_job_id(j.id());
    v1::Job seen;
    ASSERT_TRUE(jobs_->GetJob(Context(alice).get(), get, &seen).ok());
    states.push_back(seen.state());
  }
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::JOB_STATE_SCHEDULED, v1::JOB_STATE_QUEUED,
                                               v1::JOB_STATE_QUEUED}));
  refused = jobs_->SubmitJob(Context(alice).get(), submit, &job);
  EXPECT_EQ(refused.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant team-a has 2 queued jobs"));

  // The count follows the jobs: a cancelled one frees a place, and a
  // restarted ballastd counts the queued jobs it finds in its store.
  v1::CancelJobRequest cancel;
  cancel.set_job_id(mine[2].id());
  ASSERT_TRUE(jobs_->CancelJob(Context(alice).get(), cancel, &job).ok());
  ASSERT_TRUE(jobs_->SubmitJob(Context(alice).get(), submit, &job).ok());
  server_.reset();
  Start("boot", {{"team-a", TenantQuota{.max_devices = 1, .max_queued_jobs = 2}}});
  refused = jobs_->SubmitJob(Context(alice).get(), submit, &job);
  EXPECT_EQ(refused.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("tenant team-a has 2 queued jobs"));
}

// Worker ids are printed in `ballast workers`; one with a terminal escape
// could forge rows in another user's output.
TEST_F(BallastdTest, AWorkerIdThatIsNotPrintableIsRefused) {
  Start();
  v1::RegisterWorkerRequest reg = CpuWorker(1);
  reg.set_previous_worker_id("w1\x1b[2J\nforged-row");
  v1::RegisterWorkerResponse registered;
  grpc::Status refused = workers_->RegisterWorker(Context().get(), reg, &registered);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("previous_worker_id"));
  reg.set_previous_worker_id("node-1.rack_2");
  EXPECT_TRUE(workers_->RegisterWorker(Context().get(), reg, &registered).ok());
}

TEST(QuotaFlagTest, ParsesTenantsAndTheDefaultAndNamesMistakes) {
  std::map<std::string, TenantQuota> quotas;
  ASSERT_TRUE(ParseQuotaFlag("team-a:max_devices=8,max_queued_jobs=100", &quotas).ok());
  ASSERT_TRUE(ParseQuotaFlag("*:max_queued_jobs=10", &quotas).ok());
  EXPECT_EQ(quotas["team-a"].max_devices, 8);
  EXPECT_EQ(quotas["team-a"].max_queued_jobs, 100);
  EXPECT_EQ(quotas["*"].max_devices, 0);
  EXPECT_EQ(quotas["*"].max_queued_jobs, 10);
  EXPECT_THAT(ParseQuotaFlag("team-a:max_devices=1", &quotas).message(), HasSubstr("twice"));
  EXPECT_THAT(ParseQuotaFlag("team-c", &quotas).message(), HasSubstr("no ':'"));
  EXPECT_THAT(ParseQuotaFlag("team-c:max_gpus=1", &quotas).message(),
              HasSubstr("unknown key 'max_gpus'"));
  EXPECT_THAT(ParseQuotaFlag("team-c:max_devices=-1", &quotas).message(),
              HasSubstr("'max_devices=-1' is not KEY=N"));
}

}  // namespace
}  // namespace ballast::server

// The HTTP side of tenancy and of the browser's safety (issue 33): every
// route, with every kind of token.
namespace ballast::server {
namespace {

// Another id of the same form and length, which no job has.
std::string MissingJobId(const std::string& id, const std::string& other) {
  std::string missing = id;
  for (char c : std::string("0123456789abcdef")) {
    missing.back() = c;
    if (missing != id && missing != other) break;
  }
  return missing;
}

TEST_F(BallastdTest, EveryHttpRouteAnswersAnotherTenantsJobAsAMissingOne) {
  Start("boot");
  const std::string alice = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string bob = MakeToken("boot", v1::ROLE_USER, "team-b");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job a_job, b_job;
  ASSERT_TRUE(jobs_->SubmitJob(Context(alice).get(), submit, &a_job).ok());
  ASSERT_TRUE(jobs_->SubmitJob(Context(bob).get(), submit, &b_job).ok());
  const std::string missing = MissingJobId(a_job.id(), b_job.id());

  // Each route that names a job: bob gets for alice's job byte for byte what
  // he gets for a job that does not exist (the id aside), while alice and
  // the admin read it.
  for (const std::string& route :
       {"", "/ranks", "/events", "/events?after=0&limit=5", "/stream", "/stream?after=0"}) {
    SCOPED_TRACE(route);
    const HttpAnswer hidden = Http("GET", "/api/v1/jobs/" + a_job.id() + route, bob);
    const HttpAnswer absent = Http("GET", "/api/v1/jobs/" + missing + route, bob);
    EXPECT_EQ(hidden.status, 404);
    EXPECT_EQ(hidden.status, absent.status);
    EXPECT_EQ(hidden.headers, absent.headers);
    EXPECT_EQ(absl::StrReplaceAll(hidden.body, {{a_job.id(), missing}}), absent.body);
    EXPECT_EQ(hidden.body, "{\"error\":\"job " + a_job.id() + " not found\"}\n");
    EXPECT_EQ(Http("GET", "/api/v1/jobs/" + a_job.id() + route, alice).status, 200);
    EXPECT_EQ(Http("GET", "/api/v1/jobs/" + a_job.id() + route, "boot").status, 200);
  }
  // EventSource's reconnect header goes the same way.
  const HttpAnswer resumed =
      Http("GET", "/api/v1/jobs/" + a_job.id() + "/stream", bob, {{"Last-Event-ID", "1"}});
  EXPECT_EQ(resumed.status, 404);
  EXPECT_EQ(resumed.body, "{\"error\":\"job " + a_job.id() + " not found\"}\n");

  // The list: each tenant its own, the admin both.
  for (const std::string& query : {"", "?state=queued", "?limit=1000"}) {
    const HttpAnswer bobs = Http("GET", "/api/v1/jobs" + query, bob);
    EXPECT_EQ(bobs.status, 200);
    EXPECT_THAT(bobs.body, HasSubstr(b_job.id()));
    EXPECT_THAT(bobs.body, ::testing::Not(HasSubstr(a_job.id())));
    EXPECT_THAT(bobs.body, ::testing::Not(HasSubstr("team-a")));
    const HttpAnswer all = Http("GET", "/api/v1/jobs" + query, "boot");
    EXPECT_THAT(all.body, HasSubstr(a_job.id()));
    EXPECT_THAT(all.body, HasSubstr(b_job.id()));
  }

  // The dashboard's files hold no job data: the same bytes for anyone.
  for (const char* page : {"/", "/dashboard.js", "/dashboard.css"}) {
    const HttpAnswer open = Http("GET", page);
    EXPECT_EQ(open.status, 200) << page;
    EXPECT_EQ(Http("GET", page, bob).body, open.body) << page;
    EXPECT_EQ(Http("GET", page, "boot").body, open.body) << page;
  }

  // /metrics names every tenant's jobs: the admin's only; a user's valid
  // token is 403, and says nothing of any job.
  const HttpAnswer scraped = Http("GET", "/metrics", "boot");
  EXPECT_EQ(scraped.status, 200);
  EXPECT_THAT(scraped.body, HasSubstr(a_job.id()));
  for (const std::string& user : {alice, bob}) {
    const HttpAnswer refused = Http("GET", "/metrics", user);
    EXPECT_EQ(refused.status, 403);
    EXPECT_THAT(refused.body, ::testing::Not(HasSubstr("job-")));
  }
}

TEST_F(BallastdTest, AValidTokenWithoutTheRoleIs403AndABadOneIs401OnEveryRoute) {
  Start("boot");
  const std::string user = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string worker = MakeToken("boot", v1::ROLE_WORKER, "", "node-1");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context(user).get(), submit, &job).ok());
  const std::string api = "/api/v1/jobs/" + job.id();
  for (const std::string& path :
       {std::string("/api/v1/jobs"), api, api + "/ranks", api + "/events", api + "/stream"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(Http("GET", path).status, 401);
    EXPECT_EQ(Http("GET", path, "not-a-token").status, 401);
    EXPECT_EQ(Http("GET", path, "tok-0123456789abcdef.00").status, 401);
    const HttpAnswer refused = Http("GET", path, worker);
    EXPECT_EQ(refused.status, 403);
    EXPECT_EQ(refused.body, "{\"error\":\"a worker token cannot read jobs\"}\n");
    EXPECT_EQ(Http("GET", path, user).status, 200);
  }
  EXPECT_EQ(Http("GET", "/metrics").status, 401);
  EXPECT_EQ(Http("GET", "/metrics", "not-a-token").status, 401);
  EXPECT_EQ(Http("GET", "/metrics", user).status, 403);
  EXPECT_EQ(Http("GET", "/metrics", worker).status, 403);
  // A cookie is never a credential.
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "", {{"Cookie", "ballast-token=boot"}}).status, 401);
}

TEST_F(BallastdTest, EveryHttpAnswerCarriesTheSecurityHeaders) {
  Start("boot");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context("boot").get(), submit, &job).ok());
  const std::string page_policy =
      "default-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
      "frame-ancestors 'none'";
  const std::string data_policy = "default-src 'none'; frame-ancestors 'none'";
  struct Case {
    std::string path;
    std::string token;
    int status;
    std::string policy;
  };
  for (const Case& c : std::vector<Case>{
           {"/", "", 200, page_policy},
           {"/dashboard.js", "", 200, page_policy},
           {"/dashboard.css", "", 200, page_policy},
           {"/api/v1/jobs", "boot", 200, data_policy},
           {"/api/v1/jobs", "", 401, data_policy},
           {"/api/v1/jobs/" + job.id(), "boot", 200, data_policy},
           {"/api/v1/jobs/job-000000000000", "boot", 404, data_policy},
           {"/api/v1/jobs/" + job.id() + "/stream", "boot", 200, data_policy},
           {"/api/v1/nothing", "boot", 404, data_policy},
           {"/api/%FF", "boot", 404, data_policy},
           {"/metrics", "boot", 200, data_policy},
           {"/metrics", "", 401, data_policy},
           {"/healthz", "", 200, data_policy},
           {"/no-such-page", "", 404, data_policy},
       }) {
    SCOPED_TRACE(c.path + " " + c.token);
    const HttpAnswer answer = Http("GET", c.path, c.token);
    EXPECT_EQ(answer.status, c.status);
    EXPECT_EQ(answer.header("Content-Security-Policy"), c.policy);
    EXPECT_EQ(answer.header("X-Frame-Options"), "DENY");
    EXPECT_EQ(answer.header("X-Content-Type-Options"), "nosniff");
  }
}

TEST_F(BallastdTest, WithoutATokenOnlyRequestsToALoopbackNameAreAnswered) {
  Start();
  const std::string port = server_->http_address().substr(server_->http_address().rfind(':'));
  // A site whose name now resolves to 127.0.0.1 (DNS rebinding) sends its
  // own name: every path refuses it, the static files too.
  for (const char* path : {"/api/v1/jobs", "/metrics", "/", "/dashboard.js", "/healthz"}) {
    SCOPED_TRACE(path);
    for (const std::string& host : {"evil.example" + port, "127.0.0.1.evil.example" + port}) {
      const HttpAnswer refused = Http("GET", path, "", {{"Host", host}});
      EXPECT_EQ(refused.status, 403);
      EXPECT_THAT(refused.body, HasSubstr("is not a loopback name"));
    }
    for (const std::string& host : {"localhost" + port, "127.0.0.1" + port}) {
      EXPECT_EQ(Http("GET", path, "", {{"Host", host}}).status, 200);
    }
  }
}

TEST_F(BallastdTest, WithATokenAnyHostIsAnsweredAsTheTokenSays) {
  Start("boot");
  const std::string port = server_->http_address().substr(server_->http_address().rfind(':'));
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "boot", {{"Host", "ballast.example" + port}}).status, 200);
  EXPECT_EQ(Http("GET", "/api/v1/jobs", "", {{"Host", "ballast.example" + port}}).status, 401);
}

TEST_F(BallastdTest, NoHttpRouteChangesStateAndCrossSiteRequestsAreRefusedFirst) {
  Start("boot");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  v1::Job job;
  ASSERT_TRUE(jobs_->SubmitJob(Context("boot").get(), submit, &job).ok());
  const std::string own = "http://" + server_->http_address();
  for (const std::string& method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"}) {
    for (const std::string& path : {std::string("/api/v1/jobs"), "/api/v1/jobs/" + job.id(),
                                    std::string("/metrics"), std::string("/")}) {
      SCOPED_TRACE(method + " " + path);
      // From another site: refused, even with the admin's token.
      HttpAnswer answer = Http(method, path, "boot", {{"Origin", "http://evil.example"}});
      EXPECT_EQ(answer.status, 403);
      EXPECT_THAT(answer.body, HasSubstr("a cross-site request is refused: Origin "
                                         "http://evil.example is not " +
                                         own));
      EXPECT_EQ(Http(method, path, "boot", {{"Origin", "null"}}).status, 403);
      // A cookie alone is no credential, from anywhere.
      answer = Http(method, path, "", {{"Cookie", "ballast-token=boot"}, {"Origin", own}});
      EXPECT_EQ(answer.status, 403);
      EXPECT_THAT(answer.body, HasSubstr("needs 'Authorization: Bearer TOKEN'"));
      // Same origin with the bearer header, or no browser at all: nothing
      // here changes state, and the answer says which methods there are.
      for (const httplib::Headers& origin :
           {httplib::Headers{{"Origin", own}}, httplib::Headers{}}) {
        answer = Http(method, path, "boot", origin);
        EXPECT_EQ(answer.status, 405);
        EXPECT_EQ(answer.header("Allow"), "GET, HEAD");
        EXPECT_EQ(answer.header("Content-Type"), "application/json");
        EXPECT_EQ(answer.header("X-Content-Type-Options"), "nosniff");
      }
    }
  }
  // HEAD is a GET without the body.
  EXPECT_EQ(Http("HEAD", "/api/v1/jobs", "boot").status, 200);
  v1::GetJobRequest get;
  get.set_job_id(job.id());
  v1::Job seen;
  ASSERT_TRUE(jobs_->GetJob(Context("boot").get(), get, &seen).ok());
  EXPECT_EQ(seen.state(), v1::JOB_STATE_QUEUED);
}

// The OpenAI-compatible API over the same coordinator and tokens: a tenant's
// file and job are its own (another tenant gets OpenAI's 404, as for an id
// that does not exist), the job is the JobService's (gRPC sees it), and a
// worker token is refused as on the gRPC API.
TEST_F(BallastdTest, OpenAiApiKeepsTenantsApart) {
  BallastdOptions o = LocalOptions();
  o.token = "boot";
  ValidSpec(dir_.path());  // model/config.json
  o.openai_models["tiny"] = (dir_.path() / "model").string();
  o.openai_max_file_bytes = 4096;
  Start(o);
  const std::string alice = MakeToken("boot", v1::ROLE_USER, "team-a");
  const std::string bob = MakeToken("boot", v1::ROLE_USER, "team-b");
  const std::string node = MakeToken("boot", v1::ROLE_WORKER, "", "node-1");

  const size_t colon = server_->http_address().rfind(':');
  httplib::Client client(server_->http_address().substr(0, colon),
                         std::stoi(server_->http_address().substr(colon + 1)));
  client.set_read_timeout(10, 0);
  const auto bearer = [](const std::string& token) {
    return httplib::Headers{{"Authorization", "Bearer " + token}};
  };
  const std::string chat =
      R"({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})"
      "\n";
  httplib::Result uploaded = client.Post(
      "/v1/files", bearer(alice),
      httplib::MultipartFormDataItems{{"purpose", "fine-tune", "", ""},
                                      {"file", chat + chat, "chats.jsonl", "text/plain"}});
  ASSERT_TRUE(uploaded);
  ASSERT_EQ(uploaded->status, 200) << uploaded->body;
  const nlohmann::json file = nlohmann::json::parse(uploaded->body);
  EXPECT_EQ(file["bytes"], 2 * chat.size());
  const std::string id = file["id"];
  // Kept in team-a's folder of the output root, with its digest beside it.
  const std::filesystem::path kept = dir_.path() / "jobs" / "uploads-team-a" / (id + ".jsonl");
  EXPECT_TRUE(std::filesystem::exists(kept));
  std::ifstream record(dir_.path() / "jobs" / "uploads-team-a" / (id + ".json"));
  EXPECT_EQ(nlohmann::json::parse(record)["sha256"], file["sha256"]);

  // Over --openai-max-file-bytes: 413, in OpenAI's error object.
  httplib::Result large = client.Post(
      "/v1/files", bearer(alice),
      httplib::MultipartFormDataItems{{"purpose", "fine-tune", "", ""},
                                      {"file", std::string(8 * 1024, 'x'), "big.jsonl", ""}});
  ASSERT_TRUE(large);
  EXPECT_EQ(large->status, 413);
  EXPECT_EQ(nlohmann::json::parse(large->body)["error"]["param"], "file");

  const auto not_found = [](const httplib::Result& r) {
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404) << r->body;
    EXPECT_EQ(nlohmann::json::parse(r->body)["error"]["type"], "invalid_request_error");
  };
  not_found(client.Get(("/v1/files/" + id).c_str(), bearer(bob)));
  const std::string create =
      nlohmann::json({{"model", "tiny"}, {"training_file", id}, {"seed", 3}}).dump();
  not_found(client.Post("/v1/fine_tuning/jobs", bearer(bob), create, "application/json"));

  httplib::Result created =
      client.Post("/v1/fine_tuning/jobs", bearer(alice), create, "application/json");
  ASSERT_TRUE(created);
  ASSERT_EQ(created->status, 200) << created->body;
  const nlohmann::json job = nlohmann::json::parse(created->body);
  EXPECT_EQ(job["status"], "queued");
  EXPECT_EQ(job["organization_id"], "team-a");
  EXPECT_EQ(job["training_file"], id);
  const std::string job_id = job["id"];
  // The JobService's job: gRPC sees it, with the mapped spec.
  v1::GetJobRequest get;
  get.set_job_id(job_id);
  v1::Job seen;
  ASSERT_TRUE(jobs_->GetJob(Context(alice).get(), get, &seen).ok());
  EXPECT_EQ(seen.spec().data().path(), kept.string());
  EXPECT_EQ(seen.spec().seed(), 3u);

  for (const std::string& path :
       {"/v1/fine_tuning/jobs/" + job_id, "/v1/fine_tuning/jobs/" + job_id + "/events",
        "/v1/fine_tuning/jobs/" + job_id + "/checkpoints"}) {
    SCOPED_TRACE(path);
    not_found(client.Get(path.c_str(), bearer(bob)));
    httplib::Result own = client.Get(path.c_str(), bearer(alice));
    ASSERT_TRUE(own);
    EXPECT_EQ(own->status, 200) << own->body;
  }
  not_found(client.Post(("/v1/fine_tuning/jobs/" + job_id + "/cancel").c_str(), bearer(bob), "",
                        "application/json"));
  httplib::Result listed = client.Get("/v1/fine_tuning/jobs", bearer(bob));
  ASSERT_TRUE(listed);
  EXPECT_EQ(nlohmann::json::parse(listed->body)["data"], nlohmann::json::array());
  httplib::Result forbidden = client.Get("/v1/fine_tuning/jobs", bearer(node));
  ASSERT_TRUE(forbidden);
  EXPECT_EQ(forbidden->status, 403);

  httplib::Result cancelled = client.Post(("/v1/fine_tuning/jobs/" + job_id + "/cancel").c_str(),
                                          bearer(alice), "", "application/json");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(nlohmann::json::parse(cancelled->body)["status"], "cancelled");
  ASSERT_TRUE(jobs_->GetJob(Context(alice).get(), get, &seen).ok());
  EXPECT_EQ(seen.state(), v1::JOB_STATE_CANCELLED);
}

}  // namespace
}  // namespace ballast::server
