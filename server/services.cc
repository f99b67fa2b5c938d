#include "server/services.h"

#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace ballast::server {
namespace {

// How long a stream waits for news before it checks whether its client left.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(200);
// Events in one WatchJobBatch message, at most (one larger event goes alone).
constexpr size_t kMaxBatchBytes = 1 << 20;

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

// A worker token speaks for its own worker id only; an admin for any.
grpc::Status CheckActsAsItself(const Principal& who, const std::string& worker_id) {
  if (who.role != v1::ROLE_WORKER || worker_id == who.worker_id) return grpc::Status::OK;
  return grpc::Status(grpc::PERMISSION_DENIED,
                      absl::StrCat("this worker token belongs to worker ", who.worker_id,
                                   ", not to ", absl::CHexEscape(worker_id.substr(0, 128))));
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

RpcGate::RpcGate(const Authenticator* auth, MetricsRegistry* metrics, bool worker_certificates,
                 std::function<bool()> leading)
    : auth_(auth),
      worker_certificates_(worker_certificates),
      leading_(std::move(leading)),
      requests_(prometheus::BuildCounter()
                    .Name("ballast_grpc_requests_total")
                    .Help("gRPC calls handled, by method and code.")
                    .Register(metrics->registry())),
      request_seconds_(
          prometheus::BuildHistogram()
              .Name("ballast_grpc_request_seconds")
              .Help("Time from a gRPC call's arrival to its status, by method and code; for the "
                    "streams (WatchJob, StreamAssignments) the stream's whole life.")
              .Register(metrics->registry())) {}

absl::Status RpcGate::NotLeading() {
  return absl::UnavailableError(
      "this ballastd's leader lease lapsed (it could not renew it in time) and another "
      "coordinator may lead now: ask the others");
}

grpc::Status RpcGate::Authorize(grpc::ServerContextBase* context, Audience audience,
                                Principal* principal) const {
  if (!Leading()) return ToGrpcStatus(NotLeading());
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  absl::StatusOr<Principal> who = auth_->Authenticate(
      it == metadata.end() ? absl::string_view()
                           : absl::string_view(it->second.data(), it->second.size()));
  if (!who.ok()) return ToGrpcStatus(who.status());
  *principal = *std::move(who);
  if (principal->role == v1::ROLE_ADMIN) return grpc::Status::OK;
  if (principal->role == v1::ROLE_WORKER && worker_certificates_) {
    // gRPC verified the chain against --tls-client-ca; the name must be ours.
    bool matches = false;
    for (const grpc::string_ref& cn :
         context->auth_context()->FindPropertyValues("x509_common_name")) {
      matches |= absl::string_view(cn.data(), cn.size()) == principal->worker_id;
    }
    if (!matches) {
      return grpc::Status(grpc::PERMISSION_DENIED,
                          absl::StrCat("worker ", principal->worker_id,
                                       " must present a client certificate (signed by ballastd's "
                                       "--tls-client-ca) whose CN is ",
                                       principal->worker_id));
    }
  }
  const bool allowed = (audience == Audience::kUsers && principal->role == v1::ROLE_USER) ||
                       (audience == Audience::kWorkers && principal->role == v1::ROLE_WORKER);
  if (allowed) return grpc::Status::OK;
  return grpc::Status(grpc::PERMISSION_DENIED,
                      audience == Audience::kAdmins  ? "only an admin token manages tokens"
                      : audience == Audience::kUsers ? "a worker token cannot call the job API"
                                                     : "only a worker token (or an admin's) can "
                                                       "call the worker API");
}

void RpcGate::Count(const char* method, const grpc::Status& status, absl::Duration elapsed) {
  Series series;
  {
    absl::MutexLock lock(&mu_);
    Series& found = series_[{method, static_cast<int>(status.error_code())}];
    if (found.requests == nullptr) {
      const prometheus::Labels labels = {{"method", method},
                                         {"code", CodeName(status.error_code())}};
      found.requests = &requests_.Add(labels);
      found.seconds = &request_seconds_.Add(
          labels, prometheus::Histogram::BucketBoundaries{1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1,
                                                          0.5, 1, 5, 30, 300});
    }
    series = found;
  }
  series.requests->Increment();
  series.seconds->Observe(absl::ToDoubleSeconds(elapsed));
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

grpc::ServerUnaryReactor* JobServiceImpl::SubmitJob(grpc::CallbackServerContext* context,
                                                    const v1::SubmitJobRequest* request,
                                                    v1::Job* response) {
  return gate_->ServeLater(
      "SubmitJob", Audience::kUsers, context, [&](const Principal& who, auto finish) {
        coordinator_->SubmitJob(request->spec(), request->request_id(), who.tenant,
                                [response, finish](absl::StatusOr<v1::Job> job) {
                                  finish(Reply(std::move(job), response));
                                });
      });
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                                    v1::Job* response) {
  return gate_->Serve("GetJob", Audience::kUsers, context, [&](const Principal& who) {
    return Reply(coordinator_->GetJob(request->job_id(), who.JobScope()), response);
  });
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  return gate_->Serve("ListJobs", Audience::kUsers, context, [&](const Principal& who) {
    return Reply(coordinator_->ListJobs(*request, who.JobScope()), response);
  });
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  return gate_->Serve("CancelJob", Audience::kUsers, context, [&](const Principal& who) {
    return Reply(coordinator_->CancelJob(request->job_id(), who.JobScope()), response);
  });
}

grpc::Status JobServiceImpl::RollbackJob(grpc::ServerContext* context,
                                         const v1::RollbackJobRequest* request, v1::Job* response) {
  return gate_->Serve("RollbackJob", Audience::kUsers, context, [&](const Principal& who) {
    return Reply(coordinator_->RollbackJob(request->job_id(), request->to_step(), who.JobScope()),
                 response);
  });
}

grpc::Status JobServiceImpl::StreamEvents(
    grpc::ServerContext* context, const v1::WatchJobRequest& request, const Principal& who,
    const std::function<bool(const std::vector<v1::JobEvent>&)>& write) {
  absl::StatusOr<std::unique_ptr<EventWatch>> watch =
      coordinator_->WatchJob(request.job_id(), request.after_seq(), who.JobScope());
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  std::vector<v1::JobEvent> batch;
  while (!context->IsCancelled()) {
    batch.clear();
    absl::StatusOr<bool> more = (*watch)->Next(&batch, kStreamPoll);
    if (!more.ok()) return ToGrpcStatus(more.status());
    if (!write(batch)) return kClientGone;
    if (!*more) return grpc::Status::OK;
  }
  return kClientGone;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobEvent>* writer) {
  return gate_->Serve("WatchJob", Audience::kUsers, context, [&](const Principal& who) {
    return StreamEvents(context, *request, who, [&](const std::vector<v1::JobEvent>& batch) {
      size_t written = 0;
      return WriteAll(writer, batch, &written);
    });
  });
}

grpc::Status JobServiceImpl::WatchJobBatched(grpc::ServerContext* context,
                                             const v1::WatchJobRequest* request,
                                             grpc::ServerWriter<v1::WatchJobBatch>* writer) {
  return gate_->Serve("WatchJobBatched", Audience::kUsers, context, [&](const Principal& who) {
    return StreamEvents(context, *request, who, [&](const std::vector<v1::JobEvent>& batch) {
      // A message ends before the event that would take it past
      // kMaxBatchBytes, well inside a client's 4 MiB receive limit.
      v1::WatchJobBatch message;
      size_t bytes = 0;
      for (const v1::JobEvent& event : batch) {
        const size_t size = event.ByteSizeLong();
        if (message.events_size() > 0 && bytes + size > kMaxBatchBytes) {
          if (!writer->Write(message)) return false;
          message.clear_events();
          bytes = 0;
        }
        *message.add_events() = event;
        bytes += size;
      }
      return message.events_size() == 0 || writer->Write(message);
    });
  });
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext* context,
                                         const v1::ListWorkersRequest* /*request*/,
                                         v1::ListWorkersResponse* response) {
  return gate_->Serve("ListWorkers", Audience::kUsers, context, [&](const Principal&) {
    for (v1::Worker& w : coordinator_->ListWorkers()) *response->add_workers() = std::move(w);
    return grpc::Status::OK;
  });
}

// ---------------------------------------------------------------------------
// WorkerService

grpc::Status WorkerServiceImpl::RegisterWorker(grpc::ServerContext* context,
                                               const v1::RegisterWorkerRequest* request,
                                               v1::RegisterWorkerResponse* response) {
  return gate_->Serve("RegisterWorker", Audience::kWorkers, context, [&](const Principal& who) {
    return Reply(coordinator_->RegisterWorker(*request, who.worker_id), response);
  });
}

grpc::Status WorkerServiceImpl::Heartbeat(grpc::ServerContext* context,
                                          const v1::HeartbeatRequest* request,
                                          v1::HeartbeatResponse* response) {
  return gate_->Serve("Heartbeat", Audience::kWorkers, context, [&](const Principal& who) {
    if (grpc::Status s = CheckActsAsItself(who, request->worker_id()); !s.ok()) return s;
    return Reply(coordinator_->Heartbeat(*request), response);
  });
}

grpc::Status WorkerServiceImpl::StreamAssignments(grpc::ServerContext* context,
                                                  const v1::StreamAssignmentsRequest* request,
                                                  grpc::ServerWriter<v1::Assignment>* writer) {
  return gate_->Serve("StreamAssignments", Audience::kWorkers, context, [&](const Principal& who) {
    if (grpc::Status s = CheckActsAsItself(who, request->worker_id()); !s.ok()) return s;
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
      // A coordinator whose lease lapsed sends nothing more: another may be
      // scheduling these jobs now.
      if (!gate_->Leading()) {
        (*feed)->Return(std::move(batch));
        return ToGrpcStatus(RpcGate::NotLeading());
      }
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

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportEvents(grpc::CallbackServerContext* context,
                                                          const v1::ReportEventsRequest* request,
                                                          v1::ReportEventsResponse* response) {
  return gate_->ServeLater(
      "ReportEvents", Audience::kWorkers, context, [&](const Principal& who, auto finish) {
        if (grpc::Status s = CheckActsAsItself(who, request->worker_id()); !s.ok()) {
          return finish(s);
        }
        coordinator_->ReportEvents(
            *request, [response, finish](absl::StatusOr<v1::ReportEventsResponse> ack) {
              finish(Reply(std::move(ack), response));
            });
      });
}

// ---------------------------------------------------------------------------
// TokenService

grpc::Status TokenServiceImpl::CreateToken(grpc::ServerContext* context,
                                           const v1::CreateTokenRequest* request,
                                           v1::CreateTokenResponse* response) {
  return gate_->Serve("CreateToken", Audience::kAdmins, context, [&](const Principal&) {
    return Reply(auth_->CreateToken(*request), response);
  });
}

grpc::Status TokenServiceImpl::ListTokens(grpc::ServerContext* context,
                                          const v1::ListTokensRequest* /*request*/,
                                          v1::ListTokensResponse* response) {
  return gate_->Serve("ListTokens", Audience::kAdmins, context, [&](const Principal&) {
    *response = auth_->ListTokens();
    return grpc::Status::OK;
  });
}

grpc::Status TokenServiceImpl::RevokeToken(grpc::ServerContext* context,
                                           const v1::RevokeTokenRequest* request,
                                           v1::Token* response) {
  return gate_->Serve("RevokeToken", Audience::kAdmins, context, [&](const Principal&) {
    return Reply(auth_->RevokeToken(request->id()), response);
  });
}

}  // namespace ballast::server
