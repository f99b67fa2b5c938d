// The CLI's link to the coordinator: one gRPC channel to JobService, the
// bearer token, the deadline of every call, and how a call's outcome becomes
// the process exit code.
#ifndef BALLAST_CLIENT_CONNECTION_H_
#define BALLAST_CLIENT_CONNECTION_H_

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/security/credentials.h>

#include <map>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ballast/v1/job_service.grpc.pb.h"
#include "ballast/v1/token_service.grpc.pb.h"
#include "client/interrupt.h"
#include "common/coordinator_list.h"
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
  // gRPC target, usually HOST:PORT; or several separated by commas, a
  // leader and its standbys (docs/control-plane.md, "Two coordinators").
  std::string address = "localhost:50051";
  // With several coordinators, how long a call keeps trying them while none
  // serves (a failover under way) before it fails UNAVAILABLE.
  absl::Duration failover_timeout = absl::Seconds(30);
  // Say on stderr which coordinator answered each call.
  bool verbose = false;
  // Sent as `authorization: Bearer TOKEN` on every call when not empty.
  std::string token;
  // TLS or plain; null is plain TCP.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Deadline of each unary call.
  absl::Duration unary_timeout = absl::Seconds(10);
  // Deadline of each event stream; long, because a watch lasts a whole job.
  absl::Duration stream_timeout = absl::Hours(7 * 24);
};

// Whether a call that failed with `status` was not served because that
// coordinator does not lead (a standby's UNAVAILABLE, a deposed leader's
// ABORTED) or could not be reached, did not answer in time, or was cut
// (CANCELLED, when not by Ctrl-C): another coordinator may serve it. A SubmitJob carries its
// request id, so a cut one retried is still one job.
bool NotServedHere(const grpc::Status& status);

// The leader a standby's refusal named (its ballast-leader trailer); empty
// when there is none.
std::string LeaderOf(const grpc::ClientContext& context);

// A channel to each coordinator, calls going to one at a time: the leader,
// once a refusal named it. Thread-compatible; the stubs are thread-safe.
class Connection {
 public:
  // Does not connect yet. `interrupt` (not null, outlives the connection)
  // cancels the calls made through it.
  Connection(ConnectionOptions options, Interrupt* interrupt);

  const ConnectionOptions& options() const { return options_; }
  Interrupt* interrupt() const { return interrupt_; }
  v1::JobService::Stub& stub() { return *current_->stub; }
  // The coordinator calls go to now.
  const std::string& address() const { return current_->address; }
  bool several() const { return list_.several(); }

  // After a call on stub() with `context` failed with `status`, when
  // NotServedHere: moves to the leader the refusal named, or else to the
  // next address. True when the address changed (said on stderr when
  // verbose).
  bool Failed(const grpc::ClientContext& context, const grpc::Status& status);

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
    const absl::Time give_up = absl::Now() + options_.failover_timeout;
    for (;;) {
      std::unique_ptr<grpc::ClientContext> context = UnaryContext();
      Interrupt::Scope scope(interrupt_, context.get());
      Response response;
      Stub* stub;
      if constexpr (std::is_same_v<Stub, v1::TokenService::Stub>) {
        stub = current_->token_stub.get();
      } else {
        stub = current_->stub.get();
      }
      grpc::Status status = (stub->*method)(context.get(), request, &response);
      if (status.ok()) {
        Answered();
        return response;
      }
      // With several coordinators, one that does not serve passes the call
      // on: to the leader it names, or to the next (a failover under way).
      // One coordinator alone is retried while it stands by (a restart on
      // PostgreSQL waits for its predecessor's lease).
      if (!NotServedHere(status) || !(several() || !LeaderOf(*context).empty()) ||
          !Retry(*context, status, give_up)) {
        return ToAbsl(status);
      }
    }
  }

  // Failed, then waits a moment when the address did not change; false when
  // `give_up` has passed or the interrupt fired.
  bool Retry(const grpc::ClientContext& context, const grpc::Status& status, absl::Time give_up);
  // Says, when verbose, which coordinator answered (once per coordinator).
  void Answered();

  // GetJob for `job_id`.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);

  // grpc.health.v1.Health/Check for the whole server (service ""); with
  // several coordinators, of the first that is SERVING, else of the last.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> CheckHealth();

 private:
  // One coordinator's channel and stubs.
  struct Target {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::JobService::Stub> stub;
    std::unique_ptr<v1::TokenService::Stub> token_stub;
    std::unique_ptr<grpc::health::v1::Health::Stub> health_stub;
  };
  Target* TargetFor(const std::string& address);

  ConnectionOptions options_;
  Interrupt* interrupt_;
  CoordinatorList list_;
  // By address; kept for good, so a stub() handed out stays valid.
  std::map<std::string, std::unique_ptr<Target>> targets_;
  Target* current_ = nullptr;
  std::string announced_;
};

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_CONNECTION_H_
