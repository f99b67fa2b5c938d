// Copying a whole store into another, SQLite to PostgreSQL or back (`ballastd
// migrate-store FROM TO`, which `ballast migrate-store` runs), and the check
// that the copy serves what the original does.
//
// The copy goes through the Store interface on both sides: every job, evicted
// ones too, with its submission order, attempt and events (their seq kept, and
// only the events the source still holds), every worker and every token. Rows
// keep their keys, so a copy rerun over a half-filled target replaces rows
// rather than adding them.
//
// The check reads both stores back through the same interface and sums, per
// table, the SHA-256 of each row (TableSummary): the same code on both sides,
// so equal sums say that the target answers every read as the source does.
// Not thread-safe with writers: a ballastd on either store would change it
// under the copy, and is refused (Store::CheckNotInUse).
#ifndef BALLAST_SERVER_STORE_MIGRATION_H_
#define BALLAST_SERVER_STORE_MIGRATION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/store.h"

namespace ballast::server {

// One table of a store as the check sees it.
struct TableSummary {
  std::string table;  // jobs, events, workers or tokens
  int64_t rows = 0;
  // Hex of the sum, modulo 2^256, of the SHA-256 of each row's encoding (its
  // columns, length-prefixed, messages serialized deterministically): the
  // same for the same rows in any order.
  std::string checksum;
};

// The four tables of `store`, in the order jobs, events, workers, tokens.
// UNAVAILABLE or DATA_LOSS as the store's reads fail.
absl::StatusOr<std::vector<TableSummary>> SummarizeStore(Store& store);

struct MigrateOptions {
  // Copy into a target that holds rows (a rerun after a copy that failed
  // halfway); rows of the same key are replaced. The check then compares the
  // target's whole tables, so rows only the target holds fail it.
  bool allow_non_empty = false;
  // Events (or jobs without events) per transaction on the target.
  int64_t rows_per_write = 2000;
};

struct MigrationReport {
  std::vector<TableSummary> source;
  std::vector<TableSummary> target;
  // Every table's rows and checksum agree.
  bool verified() const;
};

// Copies the store at `from_url` into the one at `to_url` (sqlite:PATH or
// postgresql://...; a new SQLite file is made, its folder must exist), then
// summarizes both. INVALID_ARGUMENT for another scheme or the same URL
// twice, NOT_FOUND for a SQLite source that does not exist,
// FAILED_PRECONDITION when a ballastd has either store open or the target
// holds rows (naming them) without allow_non_empty, UNAVAILABLE when a store
// cannot be opened or written. Errors name a URL without its password. A
// copy that fails halfway leaves what it wrote in the target.
absl::StatusOr<MigrationReport> MigrateStore(const std::string& from_url, const std::string& to_url,
                                             const MigrateOptions& options = {});

// The report as a table, one line per table: rows and checksum on each side,
// and "ok" or "MISMATCH".
std::string FormatMigrationReport(const MigrationReport& report);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STORE_MIGRATION_H_
