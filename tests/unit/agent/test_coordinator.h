// TestCoordinator: a real gRPC server on 127.0.0.1 with an ephemeral port that
// implements WorkerService::ReportEvents the way ballastd's contract says
// (ack the report_id), records every request, and can be told to fail the
// next N calls with UNAVAILABLE.
#ifndef BALLAST_TESTS_UNIT_AGENT_TEST_COORDINATOR_H_
#define BALLAST_TESTS_UNIT_AGENT_TEST_COORDINATOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/worker_service.grpc.pb.h"

namespace ballast::agent {

class TestCoordinator final : public v1::WorkerService::Service {
 public:
  TestCoordinator() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~TestCoordinator() override { server_->Shutdown(absl::ToChronoTime(absl::Now())); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  void FailNext(int calls) {
    absl::MutexLock lock(&mu_);
    failures_left_ = calls;
  }
  // Every ReportEvents request received, failed ones included.
  std::vector<v1::ReportEventsRequest> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  // The events of the acknowledged requests, in order.
  std::vector<v1::RankEvent> accepted_events() const {
    absl::MutexLock lock(&mu_);
    return accepted_;
  }
  std::vector<std::string> authorizations() const {
    absl::MutexLock lock(&mu_);
    return authorizations_;
  }
  // Waits until at least `n` events were accepted; false on timeout.
  bool WaitForAccepted(size_t n, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return accepted_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  grpc::Status ReportEvents(grpc::ServerContext* context, const v1::ReportEventsRequest* request,
                            v1::ReportEventsResponse* response) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*request);
    auto auth = context->client_metadata().find("authorization");
    authorizations_.push_back(auth == context->client_metadata().end()
                                  ? ""
                                  : std::string(auth->second.data(), auth->second.size()));
    if (failures_left_ > 0) {
      --failures_left_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "test coordinator is failing");
    }
    // A repeat of the last report is acknowledged without storing it again.
    if (request->report_id() != last_report_id_) {
      for (const v1::RankEvent& e : request->events()) accepted_.push_back(e);
      last_report_id_ = request->report_id();
    }
    response->set_acked_report_id(request->report_id());
    return grpc::Status::OK;
  }

 private:
  mutable absl::Mutex mu_;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t last_report_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::ReportEventsRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RankEvent> accepted_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> authorizations_ ABSL_GUARDED_BY(mu_);
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ballast::agent

#endif  // BALLAST_TESTS_UNIT_AGENT_TEST_COORDINATOR_H_
