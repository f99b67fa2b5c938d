// Ballastd: the whole coordinator process as one object — store, coordinator,
// authenticator, gRPC server (JobService, WorkerService, TokenService,
// grpc.health.v1, reflection) and the HTTP endpoint. main() parses flags into BallastdOptions;
// tests and benchmarks start one in-process on ephemeral ports. Thread-safe.
#ifndef BALLAST_SERVER_BALLASTD_H_
#define BALLAST_SERVER_BALLASTD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/http_endpoint.h"
#include "common/job_spec.h"
#include "common/metrics.h"
#include "common/tls.h"
#include "server/authenticator.h"
#include "server/coordinator.h"
#include "server/services.h"
#include "server/store.h"
#include "server/upload_store.h"

namespace ballast::server {

// Largest request accepted; bigger ones fail with RESOURCE_EXHAUSTED.
inline constexpr int kMaxReceiveMessageBytes = 4 << 20;
static_assert(kMaxReceiveMessageBytes > kMaxJobSpecBytes,
              "a SubmitJob request must hold the largest spec ValidateJobSpec accepts");

struct BallastdOptions {
  // gRPC and HTTP addresses, HOST:PORT; port 0 picks a free one.
  std::string listen = "127.0.0.1:50051";
  std::string http = "127.0.0.1:9090";
  // "sqlite:PATH" (the folder must exist) or "postgresql://...".
  std::string store_url;
  // A store already open, used instead of opening store_url; it must
  // outlive the Ballastd. ElectedBallastd passes the one it leads by.
  Store* store = nullptr;
  // While this returns false every RPC is refused UNAVAILABLE, assignment
  // streams end before their next assignment, and /healthz says 503: a
  // leader whose lease lapsed (ElectedBallastd). Empty: always serving.
  std::function<bool()> leading;
  // Two coordinators on PostgreSQL (server/elected_ballastd.h): the address
  // a standby names to clients as the leader's (--advertise; empty: the
  // bound gRPC address), and the lease a leader renews every fifth of it
  // (--leader-lease-ms).
  std::string advertise;
  int64_t leader_lease_ms = 5000;
  std::string output_root;
  // --path-root: folders a spec's paths must lie in; empty allows any path.
  std::vector<std::string> path_roots;
  int64_t lease_ms = 15000;
  int64_t event_retention = 10000;
  // CoordinatorOptions::job_history: finished jobs the store keeps; 0 all.
  int64_t job_history = 0;
  int64_t metrics_retention_ms = 10 * 60 * 1000;
  int64_t stop_grace_ms = 10000;
  // CoordinatorOptions::agent_silence_ms; 0 picks half the lease.
  int64_t agent_silence_ms = 0;
  // The bootstrap admin token (BALLAST_TOKEN). Empty: no auth, so loopback
  // only. Set: every call needs it or a token from TokenService.
  std::string token;
  // Per-tenant limits (--quota TENANT:max_devices=N,max_queued_jobs=M);
  // "*" is the default for tenants not named.
  std::map<std::string, TenantQuota> quotas;
  // --tls-cert/--tls-key serve gRPC and HTTP over TLS; --tls-client-ca also
  // verifies client certificates, and a worker token's calls then need one
  // whose CN is its worker id (mTLS for workers).
  TlsFiles tls;
  // The OpenAI-compatible API (docs/openai-api.md): the model names a
  // create request may give (--openai-model NAME=PATH) and the largest
  // upload (--openai-max-file-bytes).
  std::map<std::string, std::string> openai_models;
  uint64_t openai_max_file_bytes = kDefaultMaxUploadBytes;
  // Unix ms; empty means the system clock.
  std::function<int64_t()> now_ms;
};

// One --openai-model flag, "NAME=PATH" with PATH absolute. INVALID_ARGUMENT
// naming what is wrong.
absl::Status ParseOpenAiModelFlag(absl::string_view flag,
                                  std::map<std::string, std::string>* models);

// One --quota flag: "TENANT:max_devices=N,max_queued_jobs=M" (either key
// may be left out; 0 is no limit), TENANT "*" for every tenant not named.
// INVALID_ARGUMENT naming what is wrong.
absl::Status ParseQuotaFlag(absl::string_view flag, std::map<std::string, TenantQuota>* quotas);

// Checks the options Ballastd::Start takes, and fills in agent_silence_ms
// when 0: INVALID_ARGUMENT naming the flag. ElectedBallastd checks them
// before it stands by, so that a standby never takes a lease it cannot serve.
absl::Status CheckBallastdOptions(BallastdOptions* options);

// ballast_build_info, and ballast_leader: 1 on a leader (or the one
// coordinator of a store), 0 on a standby (server/standby_server.h).
void AddProcessGauges(MetricsRegistry* metrics, bool leader);

class Ballastd {
 public:
  // Opens the store, loads the jobs, and starts serving. INVALID_ARGUMENT for
  // a bad option; UNAVAILABLE when an address cannot be bound or the store
  // cannot be opened.
  static absl::StatusOr<std::unique_ptr<Ballastd>> Start(BallastdOptions options);
  // Shutdown().
  ~Ballastd();

  // Ends every stream, stops serving (in-flight calls get up to 2 s), and
  // closes the store. Idempotent.
  void Shutdown();

  // The bound addresses, HOST:PORT with the real port.
  const std::string& grpc_address() const { return grpc_address_; }
  const std::string& http_address() const { return http_address_; }
  Coordinator* coordinator() { return coordinator_.get(); }
  MetricsRegistry* metrics() { return &metrics_; }

 private:
  Ballastd() = default;
  MetricsRegistry metrics_;
  // The store it opened, if it did; store_ is that one or options.store.
  std::unique_ptr<Store> owned_store_;
  Store* store_ = nullptr;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<RpcGate> gate_;
  std::unique_ptr<JobServiceImpl> job_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<TokenServiceImpl> token_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<UploadStore> uploads_;
  std::unique_ptr<HttpEndpoint> http_;
  std::string grpc_address_;
  std::string http_address_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_BALLASTD_H_
