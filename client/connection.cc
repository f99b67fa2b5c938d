#include "client/connection.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/match.h"

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

bool NotServedHere(const grpc::Status& status) {
  // CANCELLED that the CLI did not ask for (Connection::Retry looks): the
  // coordinator died with the call under way. DEADLINE_EXCEEDED: it did not
  // answer in time (frozen, or cut off).
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::CANCELLED ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return true;
  }
  // A leader deposed between a call's arrival and its commit.
  return status.error_code() == grpc::StatusCode::ABORTED &&
         (absl::StartsWith(status.error_message(), "deposed:") ||
          absl::StartsWith(status.error_message(), "standby:"));
}

Connection::Connection(ConnectionOptions options, Interrupt* interrupt)
    : options_(std::move(options)), interrupt_(interrupt), list_(options_.address) {
  current_ = TargetFor(list_.current());
}

Connection::Target* Connection::TargetFor(const std::string& address) {
  std::unique_ptr<Target>& target = targets_[address];
  if (target != nullptr) return target.get();
  target = std::make_unique<Target>();
  target->address = address;
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to 120 s; a watch that waits out a
  // coordinator restart needs to notice the new process within a second or two.
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS keeps its 20 s default: gRPC reads it as
  // the time one connection attempt may take, and at 100 ms a busy machine's
  // handshake failed ("tcp handshaker shutdown") with the coordinator up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  target->channel = grpc::CreateCustomChannel(
      address, options_.credentials ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  target->stub = v1::JobService::NewStub(target->channel);
  target->token_stub = v1::TokenService::NewStub(target->channel);
  target->health_stub = grpc::health::v1::Health::NewStub(target->channel);
  return target.get();
}

std::string LeaderOf(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadata);
  return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
}

bool Connection::Failed(const grpc::ClientContext& context, const grpc::Status& status) {
  if (!NotServedHere(status)) return false;
  const std::string leader = LeaderOf(context);
  if (!list_.Next(leader, absl::Now())) return false;
  if (options_.verbose) {
    std::cerr << "ballast: coordinator " << current_->address << " did not serve ("
              << status.error_message() << "); calling " << list_.current() << "\n";
  }
  current_ = TargetFor(list_.current());
  return true;
}

bool Connection::Retry(const grpc::ClientContext& context, const grpc::Status& status,
                       absl::Time give_up) {
  if (interrupt_->triggered() || absl::Now() >= give_up) return false;
  // A new address is tried at once; the same one again (no leader yet) after
  // a moment.
  if (Failed(context, status)) return true;
  return interrupt_->SleepFor(std::min(absl::Milliseconds(200), give_up - absl::Now()));
}

void Connection::Answered() {
  if (!options_.verbose || announced_ == current_->address) return;
  announced_ = current_->address;
  std::cerr << "ballast: coordinator " << announced_ << " answered\n";
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
  // With several coordinators the next call itself finds one that serves.
  if (several()) return !interrupt_->triggered() && absl::Now() < deadline;
  while (!interrupt_->triggered()) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return false;
    if (current_->channel->WaitForConnected(absl::ToChronoTime(std::min(now + kSlice, deadline)))) {
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
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> answer;
  // With several coordinators, the first that is SERVING (the leader);
  // else what the last one said.
  for (size_t tried = 0; tried < std::max<size_t>(1, list_.size()); ++tried) {
    std::unique_ptr<grpc::ClientContext> context = UnaryContext();
    Interrupt::Scope scope(interrupt_, context.get());
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = current_->health_stub->Check(
        context.get(), grpc::health::v1::HealthCheckRequest(), &response);
    answer = status.ok() ? absl::StatusOr<grpc::health::v1::HealthCheckResponse>(response)
                         : absl::StatusOr<grpc::health::v1::HealthCheckResponse>(ToAbsl(status));
    if (answer.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      Answered();
      break;
    }
    if (!several() || interrupt_->triggered() || !list_.Next("", absl::Now())) break;
    current_ = TargetFor(list_.current());
  }
  return answer;
}

}  // namespace ballast::client
