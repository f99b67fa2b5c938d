#include "client/connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>

namespace ballast::client {

int ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return kExitOk;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kResourceExhausted:
      // The user can fix these by changing the command, the spec or the token.
      return kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kExitUnreachable;
    case absl::StatusCode::kCancelled:
      // The CLI cancels its own calls only on Ctrl-C.
      return kExitInterrupted;
    default:
      return kExitJobFailed;
  }
}

absl::Status ToAbsl(const grpc::Status& status) {
  // grpc::StatusCode and absl::StatusCode share their numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

Connection::Connection(ConnectionOptions options, Interrupt* interrupt)
    : options_(std::move(options)), interrupt_(interrupt) {
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s; a watch that waits out a
  // coordinator restart needs to notice the new process within a second or two.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS keeps its 20 s default: gRPC reads it as
  // the time one connection attempt may take, and at 100 ms a busy machine's
  // handshake failed ("tcp handshaker shutdown") with the coordinator up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(
      options_.address,
      options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(), args);
  stub_ = v1::JobService::NewStub(channel_);
  token_stub_ = v1::TokenService::NewStub(channel_);
  health_stub_ = grpc::health::v1::Health::NewStub(channel_);
}

namespace {

std::unique_ptr<grpc::ClientContext> NewContext(const std::string& token, absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return context;
}

}  // namespace

std::unique_ptr<grpc::ClientContext> Connection::UnaryContext() const {
  return NewContext(options_.token, options_.unary_timeout);
}

std::unique_ptr<grpc::ClientContext> Connection::StreamContext() const {
  return NewContext(options_.token, options_.stream_timeout);
}

bool Connection::WaitForConnected(absl::Time deadline) {
  // Short slices, so Ctrl-C is seen while the coordinator is away.
  constexpr absl::Duration kSlice = absl::Milliseconds(200);
  while (!interrupt_->triggered()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    if (channel_->WaitForConnected(absl::ToChronoTime(std::min(now + kSlice, deadline)))) {
      return true;
    }
  }
  return false;
}

absl::StatusOr<v1::Job> Connection::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Unary(&v1::JobService::Stub::GetJob, request);
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse> Connection::CheckHealth() {
  std::unique_ptr<grpc::ClientContext> context = UnaryContext();
  Interrupt::Scope scope(interrupt_, context.get());
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      health_stub_->Check(context.get(), grpc::health::v1::HealthCheckRequest(), &response);
  if (!status.ok()) return ToAbsl(status);
  return response;
}

}  // namespace ballast::client
