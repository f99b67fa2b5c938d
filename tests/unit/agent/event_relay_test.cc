#include "worker/agent/event_relay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/unit/agent/test_coordinator.h"

namespace ballast::agent {
namespace {

using ::testing::HasSubstr;

v1::RankEvent StepEvent(int64_t step) {
  v1::RankEvent e;
  e.set_job_id("job-000000000001");
  e.set_attempt(1);
  e.set_rank(0);
  e.mutable_training()->mutable_step_metrics()->set_step(step);
  return e;
}

v1::RankEvent LogEvent(const std::string& text) {
  v1::RankEvent e;
  e.set_job_id("job-000000000001");
  e.set_attempt(1);
  e.set_rank(0);
  e.mutable_training()->mutable_log()->set_text(text);
  return e;
}

// Fast backoff keeps the retry tests short; the logic is the same.
EventRelayOptions FastOptions() {
  EventRelayOptions o;
  o.min_backoff = absl::Milliseconds(10);
  o.max_backoff = absl::Milliseconds(40);
  o.rpc_timeout = absl::Seconds(5);
  return o;
}

TEST(EventRelayTest, DeliversEveryEventInOrderInBatchesWithTheToken) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "s3cret", grpc::InsecureChannelCredentials());
  EventRelayOptions options = FastOptions();
  options.max_batch = 100;
  EventRelay relay(&connection, options);
  relay.SetWorkerId("w-1");
  for (int i = 1; i <= 250; ++i) relay.Add(StepEvent(i));
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());

  const std::vector<v1::RankEvent> got = server.accepted_events();
  ASSERT_EQ(got.size(), 250u);
  for (int i = 0; i < 250; ++i) EXPECT_EQ(got[i].training().step_metrics().step(), i + 1);
  const std::vector<v1::ReportEventsRequest> requests = server.requests();
  ASSERT_GE(requests.size(), 3u);  // at most 100 per batch
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_LE(requests[i].events_size(), 100);
    EXPECT_EQ(requests[i].worker_id(), "w-1");
    if (i > 0) EXPECT_GT(requests[i].report_id(), requests[i - 1].report_id());
  }
  for (const std::string& auth : server.authorizations()) EXPECT_EQ(auth, "Bearer s3cret");
  EXPECT_EQ(relay.Unacknowledged(), 0u);
}

// A rank may frame up to 16 MiB, the coordinator takes 4 MiB a call: an
// event that big, relayed as is, was refused on every retry and held back
// every event after it.
TEST(EventRelayTest, AnEventPastTheBoundArrivesAsAWarningAndDoesNotHoldBackTheRest) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection, FastOptions());
  relay.SetWorkerId("w-1");
  relay.Add(LogEvent(std::string(8 << 20, 'x')));
  relay.Add(StepEvent(7));
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());

  const std::vector<v1::RankEvent> got = server.accepted_events();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_THAT(got[0].training().log().text(), HasSubstr("dropped a log event of 8388"));
  EXPECT_EQ(got[1].training().step_metrics().step(), 7);
}

TEST(EventRelayTest, ResendsTheSameBatchWithTheSameReportIdUntilAcknowledged) {
  TestCoordinator server;
  server.FailNext(3);
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection, FastOptions());
  for (int i = 1; i <= 5; ++i) relay.Add(StepEvent(i));
  relay.SetWorkerId("w-1");
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());

  const std::vector<v1::ReportEventsRequest> requests = server.requests();
  ASSERT_EQ(requests.size(), 4u);  // three failures, then the ack
  for (const v1::ReportEventsRequest& r : requests) {
    EXPECT_EQ(r.report_id(), requests[0].report_id());
    EXPECT_EQ(r.SerializeAsString(), requests[0].SerializeAsString());
  }
  EXPECT_EQ(server.accepted_events().size(), 5u);
  EXPECT_EQ(server.authorizations()[0], "");  // no token configured, none sent
}

TEST(EventRelayTest, SendsNothingBeforeRegistrationAndFlushSaysWhatIsLeft) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection, FastOptions());
  relay.Add(StepEvent(1));
  relay.Add(StepEvent(2));
  absl::Status s = relay.Flush(absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 events not acknowledged"));
  EXPECT_TRUE(server.requests().empty());
  relay.SetWorkerId("w-9");
  EXPECT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(server.accepted_events().size(), 2u);
}

TEST(EventRelayTest, KeepsEventsWhileTheCoordinatorFailsAndDeliversThemLater) {
  TestCoordinator server;
  server.FailNext(1000000);
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection, FastOptions());
  relay.SetWorkerId("w-1");
  for (int i = 1; i <= 20; ++i) relay.Add(StepEvent(i));
  EXPECT_EQ(relay.Flush(absl::Now() + absl::Milliseconds(300)).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(server.requests().size(), 2u);  // it kept trying
  EXPECT_EQ(relay.Unacknowledged(), 20u);
  server.FailNext(0);
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());
  ASSERT_EQ(server.accepted_events().size(), 20u);
  EXPECT_EQ(server.accepted_events()[19].training().step_metrics().step(), 20);
}

TEST(EventRelayTest, WhenFullDropsOldestStepMetricsFirstAndSaysSo) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelayOptions options = FastOptions();
  options.max_buffered = 10;
  EventRelay relay(&connection, options);
  for (int i = 1; i <= 5; ++i) relay.Add(LogEvent(absl::StrCat("log ", i)));
  for (int i = 1; i <= 10; ++i) relay.Add(StepEvent(i));
  EXPECT_EQ(relay.Dropped(), 5);
  EXPECT_EQ(relay.Unacknowledged(), 10u);
  relay.SetWorkerId("w-1");
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());

  const std::vector<v1::RankEvent> got = server.accepted_events();
  ASSERT_EQ(got.size(), 11u);
  ASSERT_TRUE(got[0].training().has_log());
  EXPECT_EQ(got[0].training().log().level(), "warning");
  EXPECT_THAT(got[0].training().log().text(), HasSubstr("dropped 5 events"));
  EXPECT_EQ(got[0].job_id(), "job-000000000001");
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(got[1 + i].training().log().text(), absl::StrCat("log ", i + 1));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[6 + i].training().step_metrics().step(), 6 + i);
}

TEST(EventRelayTest, WhenFullOfOtherEventsDropsTheOldest) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelayOptions options = FastOptions();
  options.max_buffered = 3;
  EventRelay relay(&connection, options);
  for (int i = 1; i <= 5; ++i) relay.Add(LogEvent(absl::StrCat("log ", i)));
  EXPECT_EQ(relay.Dropped(), 2);
  relay.SetWorkerId("w-1");
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());
  const std::vector<v1::RankEvent> got = server.accepted_events();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_THAT(got[0].training().log().text(), HasSubstr("dropped 2 events"));
  EXPECT_EQ(got[1].training().log().text(), "log 3");
  EXPECT_EQ(got[3].training().log().text(), "log 5");
}

TEST(EventRelayTest, BatchesStayFarBelowTheMessageLimit) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection, FastOptions());
  for (int i = 0; i < 600; ++i) {
    v1::RankEvent e = StepEvent(i);
    e.mutable_exited()->set_stderr_tail(std::string(4096, 'e'));  // 2.4 MB in all
    relay.Add(std::move(e));
  }
  relay.SetWorkerId("w-1");
  ASSERT_TRUE(relay.Flush(absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(server.accepted_events().size(), 600u);
  const std::vector<v1::ReportEventsRequest> requests = server.requests();
  EXPECT_GE(requests.size(), 3u);
  for (const v1::ReportEventsRequest& r : requests) EXPECT_LT(r.ByteSizeLong(), 1100000u);
}

}  // namespace
}  // namespace ballast::agent
