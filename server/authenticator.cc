#include "server/authenticator.h"

#include <openssl/crypto.h>

#include <algorithm>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/crypto.h"
#include "server/worker_id.h"

namespace ballast::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";
constexpr size_t kMaxDescription = 256;

bool EqualInConstantTime(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat(why,
                   ": send 'authorization: Bearer TOKEN' with a token from `ballast token create` "
                   "(or ballastd's BALLAST_TOKEN)"));
}

}  // namespace

absl::Status CheckTenantName(absl::string_view field, absl::string_view tenant) {
  const bool ok = !tenant.empty() && tenant.size() <= 64 && tenant.front() != '-' &&
                  std::all_of(tenant.begin(), tenant.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", absl::CHexEscape(tenant.substr(0, 80)),
                   "'; a tenant is 1..64 characters of a-z, 0-9 and '-', not starting with '-'"));
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(
    Store* store, std::string bootstrap_token, std::function<int64_t()> now_ms) {
  std::unique_ptr<Authenticator> a(new Authenticator(
      store, bootstrap_token.empty() ? "" : absl::StrCat(kBearer, bootstrap_token),
      std::move(now_ms)));
  absl::StatusOr<std::vector<TokenRecord>> tokens = store->LoadTokens();
  if (!tokens.ok()) return tokens.status();
  absl::MutexLock lock(&a->mu_);
  for (TokenRecord& r : *tokens) {
    std::string id = r.token.id();
    a->tokens_.emplace(std::move(id), std::move(r));
  }
  return a;
}

absl::StatusOr<Principal> Authenticator::Authenticate(absl::string_view authorization) const {
  if (open()) return Principal{v1::ROLE_ADMIN, kDefaultTenant, ""};
  if (authorization.empty()) return Unauthenticated("no token");
  if (EqualInConstantTime(authorization, bootstrap_)) {
    return Principal{v1::ROLE_ADMIN, kDefaultTenant, ""};
  }
  if (!absl::StartsWith(authorization, kBearer)) return Unauthenticated("not a bearer token");
  const absl::string_view secret = authorization.substr(kBearer.size());
  // "tok-ID.KEY": the id finds the record, the key is checked against its hash.
  const size_t dot = secret.find('.');
  if (dot == absl::string_view::npos) return Unauthenticated("wrong token");
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(std::string(secret.substr(0, dot)));
  if (it == tokens_.end() ||
      !EqualInConstantTime(Sha256(secret.substr(dot + 1)), it->second.secret_sha256)) {
    return Unauthenticated("wrong token");
  }
  const v1::Token& t = it->second.token;
  if (t.revoked_ms() != 0) return Unauthenticated(absl::StrCat("token ", t.id(), " was revoked"));
  return Principal{t.role(), t.tenant(), t.worker_id()};
}

absl::StatusOr<v1::CreateTokenResponse> Authenticator::CreateToken(
    const v1::CreateTokenRequest& request) {
  if (open()) {
    return absl::FailedPreconditionError(
        "ballastd runs without BALLAST_TOKEN, so every caller on its machine is an admin and a "
        "token would protect nothing: start it with BALLAST_TOKEN set to make tokens");
  }
  v1::Token t;
  switch (request.role()) {
    case v1::ROLE_ADMIN:
    case v1::ROLE_USER:
      if (absl::Status s = CheckTenantName("tenant", request.tenant()); !s.ok()) return s;
      if (!request.worker_id().empty()) {
        return absl::InvalidArgumentError("worker_id: only a worker token names a worker");
      }
      t.set_tenant(request.tenant());
      break;
    case v1::ROLE_WORKER: {
      const std::string& id = request.worker_id();
      if (!IsWorkerId(id)) {
        return absl::InvalidArgumentError(
            "worker_id: a worker token needs the id its worker registers as: 1..128 characters "
            "of A-Z, a-z, 0-9, '.', '_' and '-'");
      }
      if (!request.tenant().empty()) {
        return absl::InvalidArgumentError(
            "tenant: a worker serves every tenant; a worker token has none");
      }
      t.set_worker_id(id);
      break;
    }
    default:
      return absl::InvalidArgumentError("role: one of admin, user or worker");
  }
  if (request.description().size() > kMaxDescription) {
    return absl::InvalidArgumentError(
        absl::StrCat("description: at most ", kMaxDescription, " bytes"));
  }
  t.set_role(request.role());
  t.set_description(request.description());
  const std::string key = RandomHex(32);
  TokenRecord record;
  record.secret_sha256 = Sha256(key);
  absl::MutexLock lock(&mu_);
  // Creation times are distinct, so that listing by time is listing in the
  // order of creation, even for tokens made in one millisecond.
  int64_t newest = 0;
  for (const auto& [id, r] : tokens_) newest = std::max(newest, r.token.created_ms());
  t.set_created_ms(std::max(now_ms_(), newest + 1));
  do {
    t.set_id(absl::StrCat("tok-", RandomHex(8)));
  } while (tokens_.count(t.id()) > 0);
  record.token = t;
  if (absl::Status s = store_->PutToken(record); !s.ok()) return s;
  tokens_.emplace(t.id(), std::move(record));
  v1::CreateTokenResponse response;
  *response.mutable_token() = std::move(t);
  response.set_secret(absl::StrCat(response.token().id(), ".", key));
  return response;
}

v1::ListTokensResponse Authenticator::ListTokens() const {
  v1::ListTokensResponse response;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, record] : tokens_) *response.add_tokens() = record.token;
  std::stable_sort(
      response.mutable_tokens()->begin(), response.mutable_tokens()->end(),
      [](const v1::Token& a, const v1::Token& b) { return a.created_ms() < b.created_ms(); });
  return response;
}

absl::StatusOr<v1::Token> Authenticator::RevokeToken(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = tokens_.find(id);
  if (it == tokens_.end()) {
    return absl::NotFoundError(absl::StrCat("token ", absl::CHexEscape(id.substr(0, 80)),
                                            " not found (see `ballast token list`)"));
  }
  if (it->second.token.revoked_ms() != 0) return it->second.token;
  TokenRecord revoked = it->second;
  revoked.token.set_revoked_ms(now_ms_());
  if (absl::Status s = store_->PutToken(revoked); !s.ok()) return s;
  it->second = std::move(revoked);
  return it->second.token;
}

}  // namespace ballast::server
