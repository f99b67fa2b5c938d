// gRPC glue: JobService, WorkerService and TokenService over the
// Coordinator and the Authenticator (the sync API, but for SubmitJob and ReportEvents). Each
// handler finds who is calling and whether its role may, calls with the
// caller's tenant (users see their tenant's jobs only, a worker acts only as
// its own worker id), maps absl::Status to grpc::Status with the same code,
// and counts the call in ballast_grpc_requests_total{method,code}.
// Thread-safe.
#ifndef BALLAST_SERVER_SERVICES_H_
#define BALLAST_SERVER_SERVICES_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/token_service.grpc.pb.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "common/metrics.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "server/authenticator.h"
#include "server/coordinator.h"

namespace ballast::server {

// absl::Status -> grpc::Status, code and message unchanged.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Which roles a method admits.
enum class Audience {
  kUsers,    // users and admins: the JobService
  kWorkers,  // workers and admins: the WorkerService
  kAdmins,   // the TokenService
};

// What every handler does around its body: the caller and the request count.
class RpcGate {
 public:
  // `auth` and `metrics` must outlive the gate. With `worker_certificates`
  // (mTLS), a worker token's calls must come with a verified client
  // certificate whose common name is the token's worker id.
  // With `leading`, every call is refused UNAVAILABLE while it returns false
  // (a coordinator whose leader lease lapsed: BallastdOptions::leading).
  RpcGate(const Authenticator* auth, MetricsRegistry* metrics, bool worker_certificates,
          std::function<bool()> leading = nullptr);
  // Whether this coordinator may serve: true without `leading`.
  bool Leading() const { return !leading_ || leading_(); }
  // The UNAVAILABLE a call gets while not Leading.
  static absl::Status NotLeading();
  // UNAUTHENTICATED or PERMISSION_DENIED, or the status of body(principal);
  // counted either way. `method` is a string literal (the gate keeps it).
  template <typename Body>
  grpc::Status Serve(const char* method, Audience audience, grpc::ServerContextBase* context,
                     Body&& body) {
    const absl::Time start = absl::Now();
    Principal principal;
    grpc::Status status = Authorize(context, audience, &principal);
    if (status.ok()) status = body(principal);
    Count(method, status, absl::Now() - start);
    return status;
  }
  // Serve for a callback-API unary call, whose body may finish later, from
  // another thread: body(principal, finish) calls finish(status) once, which
  // counts the call and finishes it.
  template <typename Body>
  grpc::ServerUnaryReactor* ServeLater(const char* method, Audience audience,
                                       grpc::CallbackServerContext* context, Body&& body) {
    const absl::Time start = absl::Now();
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    auto finish = [this, method, start, reactor](const grpc::Status& status) {
      Count(method, status, absl::Now() - start);
      reactor->Finish(status);
    };
    Principal principal;
    if (grpc::Status status = Authorize(context, audience, &principal); !status.ok()) {
      finish(status);
    } else {
      body(principal, std::move(finish));
    }
    return reactor;
  }

 private:
  grpc::Status Authorize(grpc::ServerContextBase* context, Audience audience,
                         Principal* principal) const;
  void Count(const char* method, const grpc::Status& status, absl::Duration elapsed)
      ABSL_LOCKS_EXCLUDED(mu_);
  const Authenticator* const auth_;
  const bool worker_certificates_;
  const std::function<bool()> leading_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& request_seconds_;
  // The series of one method and code, found once: a call then updates them
  // without the families' label lookup (which builds a histogram to find one).
  struct Series {
    prometheus::Counter* requests = nullptr;
    prometheus::Histogram* seconds = nullptr;
  };
  absl::Mutex mu_;
  std::map<std::pair<std::string_view, int>, Series> series_ ABSL_GUARDED_BY(mu_);
};

// SubmitJob is on the callback API: its reply goes out from the store's
// writer once the job is stored, so a call waiting for its commit holds no
// thread (with 100 clients, threads blocked in commits and woken one by one
// cost more CPU than the calls). Its checks before the commit (config.json,
// two indexed reads of the store) run on gRPC's thread and are short.
class JobServiceImpl final
    : public v1::JobService::WithCallbackMethod_SubmitJob<v1::JobService::Service> {
 public:
  JobServiceImpl(Coordinator* coordinator, RpcGate* gate)
      : coordinator_(coordinator), gate_(gate) {}
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
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
  grpc::Status WatchJobBatched(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                               grpc::ServerWriter<v1::WatchJobBatch>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  // Follows the job's events until its terminal one, handing each batch the
  // watch yields to `write`, which returns false once the client is gone.
  grpc::Status StreamEvents(grpc::ServerContext* context, const v1::WatchJobRequest& request,
                            const Principal& who,
                            const std::function<bool(const std::vector<v1::JobEvent>&)>& write);

  Coordinator* const coordinator_;
  RpcGate* const gate_;
};

// ReportEvents is on the callback API, as SubmitJob is: a worker's report is
// acknowledged from the store's writer once stored, so the reports of many
// workers waiting for one commit hold no thread each.
class WorkerServiceImpl final
    : public v1::WorkerService::WithCallbackMethod_ReportEvents<v1::WorkerService::Service> {
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
  grpc::ServerUnaryReactor* ReportEvents(grpc::CallbackServerContext* context,
                                         const v1::ReportEventsRequest* request,
                                         v1::ReportEventsResponse* response) override;

 private:
  Coordinator* const coordinator_;
  RpcGate* const gate_;
};

class TokenServiceImpl final : public v1::TokenService::Service {
 public:
  TokenServiceImpl(Authenticator* auth, RpcGate* gate) : auth_(auth), gate_(gate) {}
  grpc::Status CreateToken(grpc::ServerContext* context, const v1::CreateTokenRequest* request,
                           v1::CreateTokenResponse* response) override;
  grpc::Status ListTokens(grpc::ServerContext* context, const v1::ListTokensRequest* request,
                          v1::ListTokensResponse* response) override;
  grpc::Status RevokeToken(grpc::ServerContext* context, const v1::RevokeTokenRequest* request,
                           v1::Token* response) override;

 private:
  Authenticator* const auth_;
  RpcGate* const gate_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_SERVICES_H_
