// gRPC glue: JobService and WorkerService over the Coordinator (sync API).
// Each handler checks the token, calls the coordinator, maps absl::Status to
// grpc::Status with the same code, and counts the call in
// ballast_grpc_requests_total{method,code}. Thread-safe.
#ifndef BALLAST_SERVER_SERVICES_H_
#define BALLAST_SERVER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "common/metrics.h"
#include "server/coordinator.h"

namespace ballast::server {

// absl::Status -> grpc::Status, code and message unchanged.
grpc::Status ToGrpcStatus(const absl::Status& status);

// What every handler does around its body: the token and the request count.
class RpcGate {
 public:
  // An empty token lets every call in; otherwise calls must carry the
  // metadata "authorization: Bearer TOKEN".
  RpcGate(std::string token, MetricsRegistry* metrics);
  // UNAUTHENTICATED, or the body's status; counted either way.
  template <typename Body>
  grpc::Status Serve(const char* method, grpc::ServerContext* context, Body&& body) {
    const absl::Time start = absl::Now();
    grpc::Status status = Authorize(context);
    if (status.ok()) status = body();
    Count(method, status, absl::Now() - start);
    return status;
  }

 private:
  grpc::Status Authorize(grpc::ServerContext* context) const;
  void Count(const char* method, const grpc::Status& status, absl::Duration elapsed);
  const std::string expected_;  // "Bearer TOKEN", or empty
  MetricsRegistry* const metrics_;
};

class JobServiceImpl final : public v1::JobService::Service {
 public:
  JobServiceImpl(Coordinator* coordinator, RpcGate* gate)
      : coordinator_(coordinator), gate_(gate) {}
  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  grpc::Status RollbackJob(grpc::ServerContext* context, const v1::RollbackJobRequest* request,
                           v1::Job* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobEvent>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
  RpcGate* const gate_;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Coordinator* coordinator, RpcGate* gate)
      : coordinator_(coordinator), gate_(gate) {}
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status StreamAssignments(grpc::ServerContext* context,
                                 const v1::StreamAssignmentsRequest* request,
                                 grpc::ServerWriter<v1::Assignment>* writer) override;
  grpc::Status ReportEvents(grpc::ServerContext* context, const v1::ReportEventsRequest* request,
                            v1::ReportEventsResponse* response) override;

 private:
  Coordinator* const coordinator_;
  RpcGate* const gate_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_SERVICES_H_
