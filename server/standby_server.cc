#include "server/standby_server.h"

#include <grpcpp/health_check_service_interface.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace ballast::server {

// Answers every method no registered service has (all of JobService,
// WorkerService and TokenService, since none is registered) with the
// refusal, before reading the request.
class StandbyServer::Service : public grpc::CallbackGenericService {
 public:
  explicit Service(const StandbyServer* server) : server_(server) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    // gRPC's callback API: the reactor deletes itself once the call is done.
    return new Refused(context, server_->leader_address(), server_->Refusal());
  }

 private:
  class Refused : public grpc::ServerGenericBidiReactor {
   public:
    Refused(grpc::GenericCallbackServerContext* context, const std::string& leader,
            const absl::Status& refusal) {
      if (!leader.empty()) context->AddTrailingMetadata(kLeaderMetadata, leader);
      Finish(grpc::Status(grpc::UNAVAILABLE, std::string(refusal.message())));
    }
    void OnDone() override { delete this; }
  };

  const StandbyServer* const server_;
};

StandbyServer::StandbyServer() : service_(std::make_unique<Service>(this)) {}

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const BallastdOptions& options) {
  std::string http_host;
  int http_port = 0;
  if (absl::Status s = SplitHostPort(options.http, "--http", &http_host, &http_port); !s.ok()) {
    return s;
  }
  std::unique_ptr<StandbyServer> d(new StandbyServer());
  AddProcessGauges(&d->metrics_, /*leader=*/false);
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      GrpcServerCredentials(options.tls, "--tls-");
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(options.listen, *credentials, &bound);
  builder.RegisterCallbackGenericService(d->service_.get());
  d->grpc_server_ = builder.BuildAndStart();
  if (d->grpc_server_ == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", options.listen, " (in use or not local)"));
  }
  d->grpc_server_->GetHealthCheckService()->SetServingStatus(false);
  d->grpc_address_ = absl::StrCat(options.listen.substr(0, options.listen.rfind(':')), ":", bound);
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Start(
      http_host, http_port, &d->metrics_, [raw = d.get()] { return raw->Refusal(); },
      BearerTokenCheck(options.token), nullptr, HttpsFiles{options.tls.cert, options.tls.key},
      /*loopback_hosts_only=*/options.token.empty());
  if (!http.ok()) return http.status();
  d->http_ = std::move(*http);
  d->http_address_ =
      absl::StrCat(options.http.substr(0, options.http.rfind(':')), ":", d->http_->port());
  return d;
}

StandbyServer::~StandbyServer() {
  if (grpc_server_ != nullptr) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_server_->Wait();
  }
  grpc_server_.reset();
  http_.reset();
}

void StandbyServer::SetLeader(const LeaderLease& lease) {
  absl::MutexLock lock(&mu_);
  leader_ = lease;
}

std::string StandbyServer::leader_address() const {
  absl::MutexLock lock(&mu_);
  return leader_.address;
}

absl::Status StandbyServer::Refusal() const {
  absl::MutexLock lock(&mu_);
  if (leader_.address.empty()) {
    return absl::UnavailableError("standby: no coordinator leads yet; retry in a moment");
  }
  return absl::UnavailableError(absl::StrCat("standby: the leader is ", leader_.address, " (epoch ",
                                             leader_.epoch, "); call it instead"));
}

}  // namespace ballast::server
