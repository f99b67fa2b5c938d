#include "worker/agent/coordinator_connection.h"

#include "absl/strings/str_cat.h"

namespace ballast::agent {

CoordinatorConnection::CoordinatorConnection(const std::string& address, std::string token,
                                             std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(address), token_(std::move(token)) {
  grpc::ChannelArguments args;
  // Reconnect quickly after a coordinator restart; the worker's own loops
  // pace their retries. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its 20 s
  // default: gRPC reads it as the time a connection attempt may take, and at
  // 100 ms a loaded machine's handshake was cut short ("tcp handshaker
  // shutdown") while the coordinator was up.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  channel_ = grpc::CreateCustomChannel(address_, std::move(credentials), args);
  stub_ = v1::WorkerService::NewStub(channel_);
}

void CoordinatorConnection::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token_.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

}  // namespace ballast::agent
