#include "common/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

// A PEM file is small; a bigger one is a wrong path, not a certificate.
constexpr std::streamsize kMaxPemBytes = 1 << 20;

// This end's certificate chain and key, read together.
struct CertAndKey {
  std::string cert;
  std::string key;
};

absl::StatusOr<CertAndKey> ReadCertAndKey(const TlsFiles& files, const std::string& prefix) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, files.cert.empty() ? "cert" : "key", ": required with ", prefix,
        files.cert.empty() ? "key" : "cert", " (a certificate and its private key go together)"));
  }
  absl::StatusOr<std::string> cert = ReadPem(files.cert, prefix + "cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(files.key, prefix + "key");
  if (!key.ok()) return key.status();
  return CertAndKey{*std::move(cert), *std::move(key)};
}

}  // namespace

absl::StatusOr<std::string> ReadPem(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot be read"));
  std::string pem(kMaxPemBytes + 1, '\0');
  in.read(pem.data(), kMaxPemBytes + 1);
  pem.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<std::streamsize>(pem.size()) > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": over ", kMaxPemBytes, " bytes; not a PEM file"));
  }
  if (!absl::StrContains(pem, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not PEM (no -----BEGIN line)"));
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> GrpcServerCredentials(
    const TlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  if (files.cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_prefix, "cert and ", flag_prefix, "key: a server needs both for TLS"));
  }
  absl::StatusOr<CertAndKey> own = ReadCertAndKey(files, flag_prefix);
  if (!own.ok()) return own.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({std::move(own->key), std::move(own->cert)});
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(files.ca, flag_prefix + "client-ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
    // Users' CLIs connect without a certificate; a worker's is checked
    // against its token's worker id (RpcGate), so ask, verify, not require.
    options.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> GrpcChannelCredentials(
    const TlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!files.ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(files.ca, flag_prefix + "ca");
    if (!ca.ok()) return ca.status();
    options.pem_root_certs = *std::move(ca);
  }
  if (!files.cert.empty() || !files.key.empty()) {
    absl::StatusOr<CertAndKey> own = ReadCertAndKey(files, flag_prefix);
    if (!own.ok()) return own.status();
    options.pem_cert_chain = std::move(own->cert);
    options.pem_private_key = std::move(own->key);
  }
  return grpc::SslCredentials(options);
}

}  // namespace ballast
