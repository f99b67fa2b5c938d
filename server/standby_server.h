// StandbyServer: what a ballastd that does not lead serves on its addresses
// (server/elected_ballastd.h). Every gRPC call of any service fails
// UNAVAILABLE, its message naming the leader's address and epoch, which also
// goes in the trailing metadata kLeaderMetadata, so that workers and CLIs
// given several coordinators follow it; grpc.health.v1 answers NOT_SERVING,
// HTTP /healthz 503 "standby", and /metrics (with the bootstrap token, when
// one is set) shows ballast_build_info and ballast_leader 0. It keeps no
// state but the leader's name. Thread-safe.
#ifndef BALLAST_SERVER_STANDBY_SERVER_H_
#define BALLAST_SERVER_STANDBY_SERVER_H_

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/coordinator_list.h"  // kLeaderMetadata
#include "common/http_endpoint.h"
#include "common/metrics.h"
#include "server/ballastd.h"
#include "server/store.h"

namespace ballast::server {

class StandbyServer {
 public:
  // Binds options.listen and options.http (port 0 picks one) with its TLS.
  // UNAVAILABLE when an address cannot be bound.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(const BallastdOptions& options);
  // Stops serving (calls under way get up to 1 s) and frees the ports.
  ~StandbyServer();

  // Who leads, as Store::Lead said; calls from now on name it.
  void SetLeader(const LeaderLease& lease) ABSL_LOCKS_EXCLUDED(mu_);
  // The refusal every call gets now.
  absl::Status Refusal() const ABSL_LOCKS_EXCLUDED(mu_);
  // The leader's address; empty while none is known.
  std::string leader_address() const ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }

 private:
  class Service;
  StandbyServer();

  MetricsRegistry metrics_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<HttpEndpoint> http_;
  std::string grpc_address_;
  std::string http_address_;
  mutable absl::Mutex mu_;
  LeaderLease leader_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STANDBY_SERVER_H_
