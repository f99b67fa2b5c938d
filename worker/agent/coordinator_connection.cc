#include "worker/agent/coordinator_connection.h"

#include <iostream>

#include "absl/strings/str_cat.h"

namespace ballast::agent {

CoordinatorConnection::CoordinatorConnection(const std::string& addresses, std::string token,
                                             std::shared_ptr<grpc::ChannelCredentials> credentials)
    : token_(std::move(token)),
      credentials_(std::move(credentials)),
      several_(CoordinatorList(addresses).several()),
      list_(addresses) {
  absl::MutexLock lock(&mu_);
  StubFor(list_.current());
}

v1::WorkerService::StubInterface* CoordinatorConnection::StubFor(const std::string& address) {
  std::unique_ptr<v1::WorkerService::StubInterface>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    // Reconnect quickly after a coordinator restart; the worker's own loops
    // pace their retries. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its 20 s
    // default: gRPC reads it as the time a connection attempt may take, and
    // at 100 ms a loaded machine's handshake was cut short ("tcp handshaker
    // shutdown") while the coordinator was up.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    stub = v1::WorkerService::NewStub(grpc::CreateCustomChannel(address, credentials_, args));
  }
  return stub.get();
}

v1::WorkerService::StubInterface* CoordinatorConnection::stub() const {
  absl::MutexLock lock(&mu_);
  return stubs_.at(list_.current()).get();
}

std::string CoordinatorConnection::address() const {
  absl::MutexLock lock(&mu_);
  return list_.current();
}

void CoordinatorConnection::Prepare(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!token_.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

bool CoordinatorConnection::Failed(const grpc::ClientContext& context, const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
      status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
    return false;
  }
  std::string leader;
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderMetadata); it != trailers.end()) {
    leader.assign(it->second.data(), it->second.size());
  }
  absl::MutexLock lock(&mu_);
  const std::string was = list_.current();
  if (!list_.Next(leader, absl::Now())) return false;
  std::cerr << "ballast-worker: coordinator " << was << " did not serve (" << status.error_message()
            << "); " << (leader == list_.current() ? "following the leader " : "trying ")
            << list_.current() << std::endl;
  StubFor(list_.current());
  return true;
}

}  // namespace ballast::agent
