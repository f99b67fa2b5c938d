// The CLI's link to the coordinator: one gRPC channel to JobService, the
// bearer token, the deadline of every call, and how a call's outcome becomes
// the process exit code.
#ifndef BALLAST_CLIENT_CONNECTION_H_
#define BALLAST_CLIENT_CONNECTION_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <memory>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/token_service.grpc.pb.h"
#include "client/interrupt.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace ballast::client {

// Process exit codes of `ballast`.
inline constexpr int kExitOk = 0;
// The job failed or was cancelled, or the job does not exist.
inline constexpr int kExitJobFailed = 1;
// Bad command line, bad local spec, or INVALID_ARGUMENT from the coordinator.
inline constexpr int kExitUsage = 2;
// The coordinator could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED).
inline constexpr int kExitUnreachable = 3;
// Ctrl-C.
inline constexpr int kExitInterrupted = 130;

// Exit code for a failed call: the table above; codes it does not name
// (INTERNAL, FAILED_PRECONDITION...) give 1. OK gives 0.
int ExitCodeFor(absl::StatusCode code);

// The same code and message as an absl::Status.
absl::Status ToAbsl(const grpc::Status& status);

struct ConnectionOptions {
  // gRPC target, usually HOST:PORT.
  std::string address = "localhost:50051";
  // Sent as `authorization: Bearer TOKEN` on every call when not empty.
  std::string token;
  // TLS or plain; null is plain TCP.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of each unary call.
  absl::Duration unary_timeout = absl::Seconds(10);
  // Deadline of each event stream; long, because a watch lasts a whole job.
  absl::Duration stream_timeout = absl::Hours(7 * 24);
};

// A channel to one coordinator. Thread-compatible; the stub is thread-safe.
class Connection {
 public:
  // Does not connect yet. `interrupt` (not null, outlives the connection)
  // cancels the calls made through it.
  Connection(ConnectionOptions options, Interrupt* interrupt);

  const ConnectionOptions& options() const { return options_; }
  Interrupt* interrupt() const { return interrupt_; }
  v1::JobService::Stub& stub() { return *stub_; }

  // A fresh context: token metadata and the unary deadline.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  // A fresh context: token metadata and the stream deadline.
  std::unique_ptr<grpc::ClientContext> StreamContext() const;

  // Blocks until the channel is connected (true), `deadline` passes or the
  // interrupt fires (false). Starts connecting if idle.
  bool WaitForConnected(absl::Time deadline);

  // One unary call with UnaryContext(), cancellable by the interrupt; of the
  // JobService or the TokenService.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                                 const Request& request) {
    std::unique_ptr<grpc::ClientContext> context = UnaryContext();
    Interrupt::Scope scope(interrupt_, context.get());
    Response response;
    Stub* stub;
    if constexpr (std::is_same_v<Stub, v1::TokenService::Stub>) {
      stub = token_stub_.get();
    } else {
      stub = stub_.get();
    }
    grpc::Status status = (stub->*method)(context.get(), request, &response);
    if (!status.ok()) return ToAbsl(status);
    return response;
  }

  // GetJob for `job_id`.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);

  // grpc.health.v1.Health/Check for the whole server (service "").
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> CheckHealth();

 private:
  ConnectionOptions options_;
  Interrupt* interrupt_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
  std::unique_ptr<v1::TokenService::Stub> token_stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
};

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_CONNECTION_H_
