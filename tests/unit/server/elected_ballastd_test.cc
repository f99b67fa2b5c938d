// Two ballastd on one PostgreSQL database, in one process: real gRPC and
// HTTP over loopback, a real server (postgres_server.h). One leads; the
// other refuses every call naming it, and takes over once its lease ends.
#include "server/elected_ballastd.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "server/standby_server.h"
#include "tests/unit/server/grpc_health.h"
#include "tests/unit/server/postgres_server.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using testing::HealthStatus;
using testing::PostgresDatabaseTest;
using testing::PostgresServer;
using testing::TempDir;
using testing::ValidSpec;

constexpr int64_t kLeaseMs = 1000;

std::unique_ptr<grpc::ClientContext> Context() {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return context;
}

int HealthzCode(const std::string& http_address) {
  httplib::Client http("http://" + http_address);
  auto r = http.Get("/healthz");
  return r ? r->status : -1;
}

class ElectedBallastdTest : public PostgresDatabaseTest {
 protected:
  BallastdOptions Options() {
    BallastdOptions o;
    o.listen = "127.0.0.1:0";
    o.http = "127.0.0.1:0";
    o.store_url = url_;
    o.output_root = (dir_.path() / "jobs").string();
    o.leader_lease_ms = kLeaseMs;
    return o;
  }

  std::unique_ptr<ElectedBallastd> StartOne() {
    auto e = ElectedBallastd::Start(Options());
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static std::unique_ptr<v1::JobService::Stub> Jobs(const ElectedBallastd& e) {
    return v1::JobService::NewStub(
        grpc::CreateChannel(e.grpc_address(), grpc::InsecureChannelCredentials()));
  }

  // Waits up to `seconds` for `e` to lead.
  static bool LeadsWithin(const ElectedBallastd& e, int seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (!e.leading() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return e.leading();
  }

  // A call to a standby: UNAVAILABLE naming `leader` in its message and in
  // the ballast-leader trailer.
  static void ExpectRefusedNaming(const ElectedBallastd& standby, const std::string& leader) {
    auto context = Context();
    v1::ListJobsResponse list;
    grpc::Status s = Jobs(standby)->ListJobs(context.get(), v1::ListJobsRequest(), &list);
    EXPECT_EQ(s.error_code(), grpc::UNAVAILABLE) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("standby: the leader is " + leader));
    const auto& trailers = context->GetServerTrailingMetadata();
    auto it = trailers.find(kLeaderMetadata);
    ASSERT_NE(it, trailers.end()) << "no " << kLeaderMetadata << " trailer";
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), leader);
  }

  TempDir dir_;
};

TEST_F(ElectedBallastdTest, AStandbyRefusesEveryCallNamingTheLeaderAndTakesOverWhenItStops) {
  std::unique_ptr<ElectedBallastd> first = StartOne();
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->leading());
  std::unique_ptr<ElectedBallastd> second = StartOne();
  ASSERT_NE(second, nullptr);
  EXPECT_FALSE(second->leading());

  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = ValidSpec(dir_.path());
  submit.set_request_id("before-failover");
  v1::Job job;
  grpc::Status s = Jobs(*first)->SubmitJob(Context().get(), submit, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();

  ExpectRefusedNaming(*second, first->grpc_address());
  // The worker API too, and the probes say which one to route to.
  v1::RegisterWorkerRequest reg;
  reg.set_host("127.0.0.1");
  reg.set_device_kind("cpu");
  reg.set_capacity(1);
  v1::RegisterWorkerResponse registered;
  EXPECT_EQ(v1::WorkerService::NewStub(
                grpc::CreateChannel(second->grpc_address(), grpc::InsecureChannelCredentials()))
                ->RegisterWorker(Context().get(), reg, &registered)
                .error_code(),
            grpc::UNAVAILABLE);
  EXPECT_EQ(HealthStatus(first->grpc_address()), 1);
  EXPECT_EQ(HealthStatus(second->grpc_address()), 2);
  EXPECT_EQ(HealthzCode(first->http_address()), 200);
  EXPECT_EQ(HealthzCode(second->http_address()), 503);

  // The leader shuts down and releases its lease (expiry is
  // PostgresStoreTest's and integration.failover's): the standby takes it
  // at its next poll, on the same addresses, with the job.
  const std::string second_address = second->grpc_address();
  first->Shutdown();
  ASSERT_TRUE(LeadsWithin(*second, 10)) << "the standby did not take over";
  EXPECT_EQ(second->grpc_address(), second_address);
  EXPECT_EQ(HealthStatus(second->grpc_address()), 1);
  EXPECT_EQ(HealthzCode(second->http_address()), 200);
  v1::Job again;
  s = Jobs(*second)->SubmitJob(Context().get(), submit, &again);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.id(), job.id()) << "the request_id is the same job's on the new leader";
}

// Another coordinator takes the lease (as when the leader froze past it):
// the leader's next renewal finds it deposed, and it stands by naming the
// new holder, as the other standby does. When that one's lease ends, exactly
// one of the two takes over.
TEST_F(ElectedBallastdTest, ADeposedLeaderStandsByNamingTheNewOneAndOneTakesOverAfter) {
  std::unique_ptr<ElectedBallastd> first = StartOne();
  std::unique_ptr<ElectedBallastd> second = StartOne();
  ASSERT_TRUE(first != nullptr && second != nullptr);
  ASSERT_TRUE(first->leading());
  ASSERT_TRUE(PostgresServer::Exec(url_,
                                   "UPDATE ballast_leader SET epoch = epoch + 1, holder = "
                                   "'intruder', address = 'intruder:1', expires_at = now() + "
                                   "interval '60 s'")
                  .ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (first->leading() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_FALSE(first->leading()) << "the deposed leader still serves";
  // Refusals name the holder from the round after the deposition on.
  std::this_thread::sleep_for(std::chrono::milliseconds(2 * kLeaseMs / 5 + 100));
  ExpectRefusedNaming(*first, "intruder:1");
  ExpectRefusedNaming(*second, "intruder:1");
  EXPECT_FALSE(second->leading());

  ASSERT_TRUE(
      PostgresServer::Exec(url_, "UPDATE ballast_leader SET expires_at = now() - interval '1 s'")
          .ok());
  const auto taken = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!first->leading() && !second->leading() && std::chrono::steady_clock::now() < taken) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs));
  EXPECT_NE(first->leading(), second->leading()) << "exactly one leads";
  ElectedBallastd& leader = first->leading() ? *first : *second;
  ElectedBallastd& standby = first->leading() ? *second : *first;
  ExpectRefusedNaming(standby, leader.grpc_address());
}

// SQLite serves one coordinator: a second ballastd on the same file is
// refused at its start, saying so.
TEST(ElectedBallastdSqliteTest, ASecondBallastdOnOneSqliteFileIsRefused) {
  TempDir dir;
  BallastdOptions o;
  o.listen = "127.0.0.1:0";
  o.http = "127.0.0.1:0";
  o.store_url = "sqlite:" + (dir.path() / "ballastd.db").string();
  o.output_root = (dir.path() / "jobs").string();
  auto first = ElectedBallastd::Start(o);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE((*first)->leading());
  auto second = ElectedBallastd::Start(o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(), HasSubstr("SQLite serves one coordinator"));
}

}  // namespace
}  // namespace ballast::server
