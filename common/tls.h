// TLS for the gRPC API from PEM files (docs/security.md, TLS). One struct
// for both ends: a server presents cert+key and, with a CA, verifies the
// client certificates it is shown (mTLS); a client verifies the server with
// the CA and, with cert+key, presents its own.
#ifndef BALLAST_COMMON_TLS_H_
#define BALLAST_COMMON_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ballast {

// Paths to PEM files; all empty is plain TCP.
struct TlsFiles {
  // This end's certificate chain and private key.
  std::string cert;
  std::string key;
  // The CA bundle that verifies the other end.
  std::string ca;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Insecure when `files` is empty. A server needs cert and key; `ca` makes
// it ask for client certificates and verify those it gets (workers' mTLS).
// INVALID_ARGUMENT names the flag (`flag_prefix` + "cert", "key", "ca") of
// a missing pair member or a file that cannot be read or is not PEM.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix);

// Insecure when `files` is empty; otherwise TLS, verifying the server with
// `ca` (the system's roots when empty), presenting cert+key when given.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(
    const TlsFiles& files, const std::string& flag_prefix);

// The contents of a PEM file; INVALID_ARGUMENT naming `flag` otherwise.
absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag);

}  // namespace ballast

#endif  // BALLAST_COMMON_TLS_H_
