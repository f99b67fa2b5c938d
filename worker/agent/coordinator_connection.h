// CoordinatorConnection: the gRPC channel to ballastd's WorkerService and the
// per-call settings every RPC of the worker shares (token and deadline).
// Given several coordinators (--coordinator a,b: a leader and standbys on one
// PostgreSQL store), it calls one at a time and, when a call fails, follows
// the leader a standby names (its `ballast-leader` trailing metadata) or
// moves on to the next address.
//
// Thread-safe: gRPC stubs and channels may be used from any thread.
#ifndef BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_
#define BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/worker_service.grpc.pb.h"
#include "common/coordinator_list.h"

namespace ballast::agent {

class CoordinatorConnection {
 public:
  // `addresses` is HOST:PORT, or several separated by commas, reached with
  // `credentials` (TLS or not); `token`, when not empty, goes out as
  // `authorization: Bearer TOKEN` on every call.
  CoordinatorConnection(const std::string& addresses, std::string token,
                        std::shared_ptr<grpc::ChannelCredentials> credentials);

  // The stub of the coordinator calls go to now; it lives as long as this.
  v1::WorkerService::StubInterface* stub() const ABSL_LOCKS_EXCLUDED(mu_);
  // The address calls go to now.
  std::string address() const ABSL_LOCKS_EXCLUDED(mu_);
  // More than one coordinator: a call then fails fast on one that does not
  // answer (no wait_for_ready), so that the next is tried.
  bool several() const { return several_; }

  // Sets the token and a deadline `timeout` from now on a fresh context.
  void Prepare(grpc::ClientContext* context, absl::Duration timeout) const;

  // After a call on stub() with `context` ended with `status`: an
  // UNAVAILABLE or DEADLINE_EXCEEDED moves the next calls to the leader the
  // refusal named, or else to the next address. True when the address
  // changed; the change is logged to stderr, naming both.
  bool Failed(const grpc::ClientContext& context, const grpc::Status& status)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  v1::WorkerService::StubInterface* StubFor(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string token_;
  const std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const bool several_;
  mutable absl::Mutex mu_;
  CoordinatorList list_ ABSL_GUARDED_BY(mu_);
  // One channel and stub per address ever called, kept for good.
  std::map<std::string, std::unique_ptr<v1::WorkerService::StubInterface>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_COORDINATOR_CONNECTION_H_
