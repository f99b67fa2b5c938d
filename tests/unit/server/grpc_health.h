// grpc.health.v1 Check of a whole server (service ""), by a generic stub:
// the tests need no health proto of their own.
#ifndef BALLAST_TESTS_UNIT_SERVER_GRPC_HEALTH_H_
#define BALLAST_TESTS_UNIT_SERVER_GRPC_HEALTH_H_

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

namespace ballast::server::testing {

// HealthCheckResponse.status: 1 SERVING, 2 NOT_SERVING; -1 when the call
// fails, 0 when the answer is not one status field.
inline int HealthStatus(const std::string& address) {
  grpc::GenericStub stub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice empty_request(std::string{});  // HealthCheckRequest{service: ""}
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check",
                                    grpc::ByteBuffer(&empty_request, 1), &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, nullptr);
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return 0;
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : 0;
}

}  // namespace ballast::server::testing

#endif  // BALLAST_TESTS_UNIT_SERVER_GRPC_HEALTH_H_
