#include "server/services.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace ballast::server {
namespace {

// How long a stream waits for news before it checks whether its client left.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(200);

const char* CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK:
      return "OK";
    case grpc::CANCELLED:
      return "CANCELLED";
    case grpc::INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED:
      return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND:
      return "NOT_FOUND";
    case grpc::ALREADY_EXISTS:
      return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED:
      return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION:
      return "FAILED_PRECONDITION";
    case grpc::ABORTED:
      return "ABORTED";
    case grpc::OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED:
      return "UNIMPLEMENTED";
    case grpc::INTERNAL:
      return "INTERNAL";
    case grpc::UNAVAILABLE:
      return "UNAVAILABLE";
    case grpc::DATA_LOSS:
      return "DATA_LOSS";
    case grpc::UNAUTHENTICATED:
      return "UNAUTHENTICATED";
    default:
      return "UNKNOWN";
  }
}

// Writes a batch. No buffer hints: a sync-API Write with a buffer hint can
// wait for a flush that only a later write would trigger, which stalled
// replays of several events (seen with a watcher of a finished job).
template <typename T>
bool WriteAll(grpc::ServerWriter<T>* writer, const std::vector<T>& batch, size_t* written) {
  for (*written = 0; *written < batch.size(); ++*written) {
    if (!writer->Write(batch[*written])) return false;
  }
  return true;
}

const grpc::Status kClientGone(grpc::CANCELLED, "the client went away");

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

RpcGate::RpcGate(std::string token, MetricsRegistry* metrics)
    : expected_(token.empty() ? "" : absl::StrCat("Bearer ", token)), metrics_(metrics) {
  metrics_->Describe("ballast_grpc_requests_total", "gRPC calls handled, by method and code.",
                     MetricType::kCounter);
  metrics_->Describe("ballast_grpc_request_seconds",
                     "Time from a gRPC call's arrival to its status, by method and code; for the "
                     "streams (WatchJob, StreamAssignments) the stream's whole life.",
                     MetricType::kHistogram,
                     {1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 300});
}

grpc::Status RpcGate::Authorize(grpc::ServerContext* context) const {
  if (expected_.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end() || std::string_view(it->second.data(), it->second.size()) != expected_) {
    return grpc::Status(grpc::UNAUTHENTICATED,
                        "missing or wrong token: send 'authorization: Bearer $BALLAST_TOKEN'");
  }
  return grpc::Status::OK;
}

void RpcGate::Count(const char* method, const grpc::Status& status, absl::Duration elapsed) {
  const MetricLabels labels = {{"method", method}, {"code", CodeName(status.error_code())}};
  metrics_->Add("ballast_grpc_requests_total", labels);
  metrics_->Observe("ballast_grpc_request_seconds", labels, absl::ToDoubleSeconds(elapsed));
}

// Copies a StatusOr's value into the response, or maps its error.
template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = std::move(*result);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------
// JobService

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request, v1::Job* response) {
  return gate_->Serve("SubmitJob", context, [&] {
    return Reply(coordinator_->SubmitJob(request->spec(), request->request_id()), response);
  });
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  return gate_->Serve("GetJob", context,
                      [&] { return Reply(coordinator_->GetJob(request->job_id()), response); });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  return gate_->Serve("ListJobs", context,
                      [&] { return Reply(coordinator_->ListJobs(*request), response); });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  return gate_->Serve("CancelJob", context,
                      [&] { return Reply(coordinator_->CancelJob(request->job_id()), response); });
}

grpc::Status JobServiceImpl::RollbackJob(grpc::ServerContext* context,
                                         const v1::RollbackJobRequest* request, v1::Job* response) {
  return gate_->Serve("RollbackJob", context, [&] {
    return Reply(coordinator_->RollbackJob(request->job_id(), request->to_step()), response);
  });
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return gate_->Serve("WatchJob", context, [&] {
    absl::StatusOr<std::unique_ptr<EventWatch>> watch =
        coordinator_->WatchJob(request->job_id(), request->after_seq());
    if (!watch.ok()) return ToGrpcStatus(watch.status());
    std::vector<v1::JobEvent> batch;
    while (!context->IsCancelled()) {
      batch.clear();
      absl::StatusOr<bool> more = (*watch)->Next(&batch, kStreamPoll);
      if (!more.ok()) return ToGrpcStatus(more.status());
      size_t written = 0;
      if (!WriteAll(writer, batch, &written)) return kClientGone;
      if (!*more) return grpc::Status::OK;
    }
    return kClientGone;
  });
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* context,
                                         const v1::ListWorkersRequest* /*request*/,
                                         v1::ListWorkersResponse* response) {
  return gate_->Serve("ListWorkers", context, [&] {
    for (v1::Worker& w : coordinator_->ListWorkers()) *response->add_workers() = std::move(w);
    return grpc::Status::OK;
  });
}

// ---------------------------------------------------------------------------
// WorkerService

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  return gate_->Serve("RegisterWorker", context,
                      [&] { return Reply(coordinator_->RegisterWorker(*request), response); });
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  return gate_->Serve("Heartbeat", context,
                      [&] { return Reply(coordinator_->Heartbeat(*request), response); });
}

grpc::Status WorkerServiceImpl::StreamAssignments(grpc::ServerContext* context,
                                                  const v1::StreamAssignmentsRequest* request,
                                                  grpc::ServerWriter<v1::Assignment>* writer) {
  return gate_->Serve("StreamAssignments", context, [&] {
    absl::StatusOr<std::unique_ptr<AssignmentFeed>> feed =
        coordinator_->StreamAssignments(request->worker_id());
    if (!feed.ok()) return ToGrpcStatus(feed.status());
    // Headers go out at once, so the worker knows it is connected before
    // the first assignment.
    writer->SendInitialMetadata();
    std::vector<v1::Assignment> batch;
    while (!context->IsCancelled()) {
      batch.clear();
      const bool current = (*feed)->Next(&batch, kStreamPoll);
      size_t written = 0;
      if (!WriteAll(writer, batch, &written)) {
        (*feed)->Return(std::vector<v1::Assignment>(batch.begin() + written, batch.end()));
        return kClientGone;
      }
      if (!current) {
        return grpc::Status(grpc::UNAVAILABLE,
                            "stream closed: replaced by a newer one, the lease ran out, or "
                            "ballastd is shutting down; register or reconnect");
      }
    }
    return kClientGone;
  });
}

grpc::Status WorkerServiceImpl::ReportEvents(grpc::ServerContext* context,
                                             const v1::ReportEventsRequest* request,
                                             v1::ReportEventsResponse* response) {
  return gate_->Serve("ReportEvents", context,
                      [&] { return Reply(coordinator_->ReportEvents(*request), response); });
}

}  // namespace ballast::server
