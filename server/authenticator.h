// Authenticator: who a request comes from. A request carries
// "authorization: Bearer SECRET"; the secret is either the bootstrap admin
// token (BALLAST_TOKEN, given to ballastd at start) or an API token made by
// CreateToken, which binds its holder to a tenant and a role
// (docs/security.md). Only the SHA-256 of a token's secret is stored: a copy
// of the store lets nobody in.
//
// Without a bootstrap token ballastd runs open, on loopback only: every
// caller is the admin of tenant "default", and tokens cannot be made.
//
// Thread-safe.
#ifndef BALLAST_SERVER_AUTHENTICATOR_H_
#define BALLAST_SERVER_AUTHENTICATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "ballast/v1/token_service.pb.h"
#include "server/store.h"

namespace ballast::server {

struct Principal {
  v1::Role role = v1::ROLE_UNSPECIFIED;
  std::string tenant;
  // ROLE_WORKER: the only worker id its calls may name.
  std::string worker_id;
  // The jobs it may see: its tenant's, or every tenant's (empty) for an admin.
  std::string JobScope() const { return role == v1::ROLE_ADMIN ? "" : tenant; }
};

class Authenticator {
 public:
  // Loads the stored tokens. An empty `bootstrap_token` makes ballastd open.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(Store* store,
                                                               std::string bootstrap_token,
                                                               std::function<int64_t()> now_ms);

  bool open() const { return bootstrap_.empty(); }

  // `authorization` is the header's value, empty when absent.
  // UNAUTHENTICATED when it is missing, malformed, unknown or revoked.
  absl::StatusOr<Principal> Authenticate(absl::string_view authorization) const;

  // FAILED_PRECONDITION on an open ballastd; INVALID_ARGUMENT for a bad field.
  absl::StatusOr<v1::CreateTokenResponse> CreateToken(const v1::CreateTokenRequest& request);
  v1::ListTokensResponse ListTokens() const;
  absl::StatusOr<v1::Token> RevokeToken(const std::string& id);

 private:
  Authenticator(Store* store, std::string bootstrap, std::function<int64_t()> now_ms)
      : store_(store), bootstrap_(std::move(bootstrap)), now_ms_(std::move(now_ms)) {}

  Store* const store_;
  // "Bearer TOKEN", or empty when open.
  const std::string bootstrap_;
  const std::function<int64_t()> now_ms_;
  mutable absl::Mutex mu_;
  // By token id, in creation order of ids (which are random, so ListTokens
  // sorts by created_ms).
  std::map<std::string, TokenRecord> tokens_ ABSL_GUARDED_BY(mu_);
};

// A tenant is 1..64 characters of [a-z0-9-], not starting with '-'.
// INVALID_ARGUMENT naming `field` otherwise.
absl::Status CheckTenantName(absl::string_view field, absl::string_view tenant);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_AUTHENTICATOR_H_
