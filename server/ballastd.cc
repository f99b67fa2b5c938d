#include "server/ballastd.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <filesystem>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/job_spec_paths.h"
#include "common/version.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "server/http_api.h"
#include "server/openai_api.h"

namespace ballast::server {

absl::Status ParseQuotaFlag(absl::string_view flag, std::map<std::string, TenantQuota>* quotas) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quota ", flag, ": ", why,
        "; write TENANT:max_devices=N,max_queued_jobs=M (TENANT * for every other tenant)"));
  };
  const size_t colon = flag.find(':');
  if (colon == absl::string_view::npos) return bad("no ':' after the tenant");
  const std::string tenant(flag.substr(0, colon));
  if (quotas->count(tenant) > 0) return bad(absl::StrCat("tenant ", tenant, " given twice"));
  TenantQuota quota;
  for (absl::string_view item : absl::StrSplit(flag.substr(colon + 1), ',')) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    int32_t value = 0;
    if (!absl::SimpleAtoi(kv.second, &value) || value < 0) {
      return bad(absl::StrCat("'", item, "' is not KEY=N with N >= 0"));
    }
    if (kv.first == "max_devices") {
      quota.max_devices = value;
    } else if (kv.first == "max_queued_jobs") {
      quota.max_queued_jobs = value;
    } else {
      return bad(absl::StrCat("unknown key '", kv.first, "'"));
    }
  }
  (*quotas)[tenant] = quota;
  return absl::OkStatus();
}

absl::Status ParseOpenAiModelFlag(absl::string_view flag,
                                  std::map<std::string, std::string>* models) {
  const size_t equals = flag.find('=');
  if (equals == 0 || equals == absl::string_view::npos || equals + 1 == flag.size() ||
      flag[equals + 1] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--openai-model '", flag, "' is not NAME=PATH with PATH an absolute model folder"));
  }
  const std::string name(flag.substr(0, equals));
  if (models->count(name) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("--openai-model: ", name, " given twice"));
  }
  (*models)[name] = std::string(flag.substr(equals + 1));
  return absl::OkStatus();
}

void AddProcessGauges(MetricsRegistry* metrics, bool leader) {
  prometheus::BuildGauge()
      .Name("ballast_build_info")
      .Help("Build of this ballastd; the value is 1.")
      .Register(metrics->registry())
      .Add({{"version", kVersion}, {"commit", kGitCommit}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("ballast_leader")
      .Help("1 on the coordinator that leads, 0 on a standby.")
      .Register(metrics->registry())
      .Add({})
      .Set(leader ? 1 : 0);
}

absl::Status CheckBallastdOptions(BallastdOptions* options_in) {
  BallastdOptions& options = *options_in;
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
  if (options.job_history < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--job-history: ", options.job_history,
                                                   "; allowed 0 (keep every job) or more"));
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
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Ballastd>> Ballastd::Start(BallastdOptions options) {
  if (absl::Status s = CheckBallastdOptions(&options); !s.ok()) return s;
  std::string http_host;
  int http_port = 0;
  (void)SplitHostPort(options.http, "--http", &http_host, &http_port);  // checked above

  // abseil's deadlock detector (on in this abseil build) walks a global graph
  // on every lock; the lock order here is simple and annotated, so turn it
  // off and keep the hot event path cheap.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::unique_ptr<Ballastd> d(new Ballastd());
  AddProcessGauges(&d->metrics_, /*leader=*/true);

  if (options.store != nullptr) {
    d->store_ = options.store;
  } else {
    absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.store_url);
    if (!store.ok()) return store.status();
    d->owned_store_ = std::move(*store);
    d->store_ = d->owned_store_.get();
  }
  CoordinatorOptions co;
  co.output_root = options.output_root;
  co.path_roots = options.path_roots;
  co.lease_ms = options.lease_ms;
  co.event_retention = options.event_retention;
  co.job_history = options.job_history;
  co.metrics_retention_ms = options.metrics_retention_ms;
  co.stop_grace_ms = options.stop_grace_ms;
  co.agent_silence_ms = options.agent_silence_ms;
  co.now_ms = options.now_ms;
  for (const auto& [tenant, quota] : options.quotas) {
    if (tenant == "*") {
      co.default_quota = quota;
    } else if (absl::Status s = CheckTenantName("--quota", tenant); !s.ok()) {
      return s;
    } else {
      co.quotas[tenant] = quota;
    }
  }
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(d->store_, &d->metrics_, std::move(co));
  if (!coordinator.ok()) return coordinator.status();
  d->coordinator_ = std::move(*coordinator);

  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(
      d->store_, options.token,
      options.now_ms ? options.now_ms : [] { return absl::ToUnixMillis(absl::Now()); });
  if (!auth.ok()) return auth.status();
  d->auth_ = std::move(*auth);
  d->gate_ =
      std::make_unique<RpcGate>(d->auth_.get(), &d->metrics_,
                                /*worker_certificates=*/!options.tls.ca.empty(), options.leading);
  d->token_service_ = std::make_unique<TokenServiceImpl>(d->auth_.get(), d->gate_.get());
  d->job_service_ = std::make_unique<JobServiceImpl>(d->coordinator_.get(), d->gate_.get());
  d->worker_service_ = std::make_unique<WorkerServiceImpl>(d->coordinator_.get(), d->gate_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      GrpcServerCredentials(options.tls, "--tls-");
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.listen, *credentials, &bound);
  builder.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // Up to this many idle threads stay polling, instead of gRPC's default
  // of 2: a sync call that waits for its commit (all but SubmitJob) holds a
  // thread, and under load the threads that finished would otherwise exit
  // and be made again for the next calls (+10% calls/s, measured when
  // SubmitJob was a sync call, at 100 clients).
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 128);
  builder.RegisterService(d->job_service_.get());
  builder.RegisterService(d->worker_service_.get());
  builder.RegisterService(d->token_service_.get());
  d->grpc_server_ = builder.BuildAndStart();
  if (d->grpc_server_ == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", options.listen, " (in use or not local)"));
  }
  d->grpc_address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", bound);

  // Uploads become specs' data paths, which are absolute.
  const std::string output_root =
      options.output_root.empty() ? "" : std::filesystem::absolute(options.output_root).string();
  d->uploads_ = std::make_unique<UploadStore>(output_root);
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Start(
      http_host, http_port, &d->metrics_,
      [c = d->coordinator_.get(), gate = d->gate_.get()] {
        if (!gate->Leading()) return gate->NotLeading();
        return c->Healthy();
      },
      [auth = d->auth_.get()](const std::string& authorization) -> absl::Status {
        // Every tenant's jobs are on /metrics: admins only.
        absl::StatusOr<Principal> who = auth->Authenticate(authorization);
        if (!who.ok()) return who.status();
        if (who->role != v1::ROLE_ADMIN) {
          return absl::PermissionDeniedError("/metrics shows every tenant's jobs: an admin token");
        }
        return absl::OkStatus();
      },
      [&](HttpRoutes* server) {
        AddHttpApi(server, d->coordinator_.get(), d->auth_.get());
        AddOpenAiApi(server, d->coordinator_.get(), d->auth_.get(), d->uploads_.get(),
                     OpenAiApiOptions{options.openai_models, options.openai_max_file_bytes,
                                      output_root, options.path_roots});
      },
      HttpsFiles{options.tls.cert, options.tls.key},
      // Open, only this machine's pages may use it, not a site that rebinds
      // its name to 127.0.0.1.
      /*loopback_hosts_only=*/d->auth_->open());
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
  owned_store_.reset();
  store_ = nullptr;
}

}  // namespace ballast::server
