#include "server/store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/postgres_store.h"
#include "server/sqlite_store.h"
#include "server/store_rows.h"

namespace ballast::server {
namespace {

enum class Backend { kSqlite, kPostgres };

// The backend of `url`; INVALID_ARGUMENT naming it (without its password)
// for another scheme, after `key`, the flag or argument that gave it.
absl::StatusOr<Backend> BackendOf(const std::string& url, absl::string_view key) {
  if (absl::StartsWith(url, "sqlite:") && url.size() > 7) return Backend::kSqlite;
  if (absl::StartsWith(url, "postgresql://") || absl::StartsWith(url, "postgres://")) {
    return Backend::kPostgres;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(key, ": '", RedactStoreUrl(url),
                   "' is not supported; expected sqlite:PATH or postgresql://..."));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& url) {
  absl::StatusOr<Backend> backend = BackendOf(url, "--store");
  if (!backend.ok()) return backend.status();
  if (*backend == Backend::kSqlite) return SqliteStore::Open(url.substr(7));
  return PostgresStore::Open(url);
}

absl::Status Store::CheckUrl(const std::string& url, absl::string_view key) {
  return BackendOf(url, key).status();
}

absl::Status Store::CheckNotInUse(const std::string& url) {
  absl::StatusOr<Backend> backend = BackendOf(url, "store");
  if (!backend.ok()) return backend.status();
  if (*backend == Backend::kSqlite) return SqliteStore::CheckNotInUse(url.substr(7));
  return PostgresStore::CheckNotInUse(url);
}

}  // namespace ballast::server
