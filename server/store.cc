#include "server/store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/postgres_store.h"
#include "server/sqlite_store.h"
#include "server/store_rows.h"

namespace ballast::server {

absl::StatusOr<std::unique_ptr<Store>> Store::Open(const std::string& url) {
  if (absl::StartsWith(url, "sqlite:") && url.size() > 7) return SqliteStore::Open(url.substr(7));
  if (absl::StartsWith(url, "postgresql://") || absl::StartsWith(url, "postgres://")) {
    return PostgresStore::Open(url);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--store: '", RedactStoreUrl(url),
                   "' is not supported; expected sqlite:PATH or postgresql://..."));
}

}  // namespace ballast::server
