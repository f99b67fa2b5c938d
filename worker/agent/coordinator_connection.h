// CoordinatorConnection: the gRPC channel to ballastd's WorkerService and the
// per-call settings every RPC of the worker shares (token and deadline).
//
// Thread-safe: gRPC stubs and channels may be used from any thread.
#ifndef BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_
#define BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "ballast/v1/worker_service.grpc.pb.h"

namespace ballast::agent {

class CoordinatorConnection {
 public:
  // `address` is HOST:PORT, reached with `credentials` (TLS or not); `token`,
  // when not empty, goes out as `authorization: Bearer TOKEN` on every call.
  CoordinatorConnection(const std::string& address, std::string token,
                        std::shared_ptr<grpc::ChannelCredentials> credentials);

  v1::WorkerService::StubInterface* stub() const { return stub_.get(); }
  const std::string& address() const { return address_; }

  // Sets the token and a deadline `timeout` from now on a fresh context.
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

 private:
  const std::string address_;
  const std::string token_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::StubInterface> stub_;
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_
