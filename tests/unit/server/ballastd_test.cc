// ballastd end to end in one process: real gRPC and HTTP over loopback.
#include "server/ballastd.h"

#include <gmock/gmock.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>

#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;
using testing::ValidSpec;

class BallastdTest : public ::testing::Test {
 protected:
  void Start(const std::string& token = "") {
    BallastdOptions o;
    o.listen = "127.0.0.1:0";
    o.http = "127.0.0.1:0";
    o.store_url = "sqlite:" + (dir_.path() / "ballastd.db").string();
    o.output_root = (dir_.path() / "jobs").string();
    o.token = token;
    auto d = Ballastd::Start(o);
    ASSERT_TRUE(d.ok()) << d.status();
    server_ = std::move(*d);
    auto channel = grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    workers_ = v1::WorkerService::NewStub(channel);
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
    const size_t colon = server_->http_address().rfind(':');
    httplib::Client client(server_->http_address().substr(0, colon),
                           std::stoi(server_->http_address().substr(colon + 1)));
    auto response = client.Get(path.c_str());
    *status = response ? response->status : -1;
    return response ? response->body : "";
  }

  TempDir dir_;
  std::unique_ptr<Ballastd> server_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
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

TEST_F(BallastdTest, SubmitRefusesAnUnsupportedModelTypeWithInvalidArgument) {
  Start();
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  std::ofstream(dir_.path() / "model" / "config.json")
      << R"({"model_type": "qwen3_moe", "max_position_embeddings": 2048})";
  v1::Job job;
  grpc::Status refused = jobs_->SubmitJob(Context().get(), submit, &job);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("model_type 'qwen3_moe'"));
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
  BallastdOptions o;
  o.store_url = "sqlite:" + (dir_.path() / "ballastd.db").string();
  o.output_root = (dir_.path() / "jobs").string();
  o.listen = "0.0.0.0:0";
  o.http = "127.0.0.1:0";
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

TEST_F(BallastdTest, WithATokenMetricsWantItAndHealthzStaysOpen) {
  Start("s3cret");
  int status = 0;
  EXPECT_THAT(HttpGet("/metrics", &status), HasSubstr("missing or wrong token"));
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
  EXPECT_THAT(metrics,
              HasSubstr("ballast_grpc_requests_total{method=\"GetJob\",code=\"NOT_FOUND\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("# TYPE ballast_scheduler_decision_seconds histogram\n"));
  EXPECT_THAT(metrics, HasSubstr("ballast_build_info{version=\""));
}

TEST_F(BallastdTest, HealthServiceAnswersServing) {
  Start();
  grpc::GenericStub stub(
      grpc::CreateChannel(server_->grpc_address(), grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  auto context = Context();
  grpc::Slice empty_request(std::string{});  // HealthCheckRequest{service: ""}
  auto call = stub.PrepareUnaryCall(context.get(), "/grpc.health.v1.Health/Check",
                                    grpc::ByteBuffer(&empty_request, 1), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2)) << "HealthCheckResponse{status: SERVING}";
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
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
