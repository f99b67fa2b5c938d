#include "server/ballastd.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/job_spec_paths.h"
#include "common/version.h"
#include "server/http_api.h"

namespace ballast::server {

absl::StatusOr<std::unique_ptr<Ballastd>> Ballastd::Start(BallastdOptions options) {
  std::string grpc_host, http_host;
  int grpc_port = 0, http_port = 0;
  if (absl::Status s = SplitHostPort(options.listen, "--listen", &grpc_host, &grpc_port); !s.ok()) {
    return s;
  }
  if (absl::Status s = SplitHostPort(options.http, "--http", &http_host, &http_port); !s.ok()) {
    return s;
  }
  // Without a token anyone who reaches the port could submit jobs, read
  // every job and pose as a worker: only this machine may then reach it.
  if (options.token.empty()) {
    for (const auto& [flag, host, address] : {std::tuple{"--listen", grpc_host, options.listen},
                                              std::tuple{"--http", http_host, options.http}}) {
      if (!IsLoopbackHost(host)) {
        return absl::InvalidArgumentError(absl::StrCat(
            flag, " ", address,
            " is reachable from other machines, and no BALLAST_TOKEN is "
            "set: anyone could submit and read jobs. Set BALLAST_TOKEN, or listen on 127.0.0.1"));
      }
    }
  }
  if (absl::Status s = CheckPathRoots(options.path_roots); !s.ok()) return s;
  if (options.lease_ms < 1000 || options.lease_ms > 600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lease-ms: ", options.lease_ms, "; allowed 1000..600000"));
  }
  if (options.event_retention < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--event-retention: ", options.event_retention, "; allowed 1 or more"));
  }
  if (options.stop_grace_ms < 0 || options.stop_grace_ms > 600000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stop-grace-ms: ", options.stop_grace_ms, "; allowed 0..600000"));
  }
  if (options.agent_silence_ms == 0) options.agent_silence_ms = options.lease_ms / 2;
  if (options.agent_silence_ms < 100 || options.agent_silence_ms > 600000) {
    return absl::InvalidArgumentError(absl::StrCat("--agent-silence-ms: ", options.agent_silence_ms,
                                                   "; allowed 100..600000 (0: half the lease)"));
  }

  // abseil's deadlock detector (on in this abseil build) walks a global graph
  // on every lock; the lock order here is simple and annotated, so turn it
  // off and keep the hot event path cheap.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::unique_ptr<Ballastd> d(new Ballastd());
  d->metrics_.Describe("ballast_build_info", "Build of this ballastd; the value is 1.",
                       MetricType::kGauge);
  d->metrics_.Set("ballast_build_info", {{"version", kVersion}, {"commit", kGitCommit}}, 1);

  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.store_url);
  if (!store.ok()) return store.status();
  d->store_ = std::move(*store);
  CoordinatorOptions co;
  co.output_root = options.output_root;
  co.path_roots = options.path_roots;
  co.lease_ms = options.lease_ms;
  co.event_retention = options.event_retention;
  co.metrics_retention_ms = options.metrics_retention_ms;
  co.stop_grace_ms = options.stop_grace_ms;
  co.agent_silence_ms = options.agent_silence_ms;
  co.now_ms = options.now_ms;
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(d->store_.get(), &d->metrics_, std::move(co));
  if (!coordinator.ok()) return coordinator.status();
  d->coordinator_ = std::move(*coordinator);

  d->gate_ = std::make_unique<RpcGate>(options.token, &d->metrics_);
  d->job_service_ = std::make_unique<JobServiceImpl>(d->coordinator_.get(), d->gate_.get());
  d->worker_service_ = std::make_unique<WorkerServiceImpl>(d->coordinator_.get(), d->gate_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &bound);
  builder.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  builder.RegisterService(d->job_service_.get());
  builder.RegisterService(d->worker_service_.get());
  d->grpc_server_ = builder.BuildAndStart();
  if (d->grpc_server_ == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", options.listen, " (in use or not local)"));
  }
  d->grpc_address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", bound);

  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Start(
      http_host, http_port, &d->metrics_, [c = d->coordinator_.get()] { return c->Healthy(); },
      options.token,
      [c = d->coordinator_.get(), token = options.token](httplib::Server* server) {
        AddHttpApi(server, c, token);
      });
  if (!http.ok()) return http.status();
  d->http_ = std::move(*http);
  d->http_address_ =
      absl::StrCat(options.http.substr(0, options.http.rfind(':')), ":", d->http_->port());
  return d;
}

Ballastd::~Ballastd() { Shutdown(); }

void Ballastd::Shutdown() {
  // Streams end first, so the gRPC shutdown below finds no call to wait for.
  if (coordinator_ != nullptr) coordinator_->Shutdown();
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    grpc_server_->Wait();
    grpc_server_.reset();
  }
  http_.reset();
  coordinator_.reset();
  store_.reset();
}

}  // namespace ballast::server
