// What the store's backends have in common: the columns of a job's row and
// how a JobRecord maps onto them, the retention rule for events, the errors
// every backend gives alike, and a store URL as it may be printed. SQLite
// (server/sqlite_store.h) and PostgreSQL (server/postgres_store.h) differ
// only in their SQL and how they run it.
#ifndef BALLAST_SERVER_STORE_ROWS_H_
#define BALLAST_SERVER_STORE_ROWS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store.h"

namespace ballast::server {

// The version of the schema this ballastd reads and writes, stored in each
// store (SQLite's user_version; PostgreSQL's ballast_schema row), so that a
// later ballastd can tell what it migrates from.
inline constexpr int64_t kSchemaVersion = 1;

// FAILED_PRECONDITION naming the store `where` when it holds schema version
// `found` and this ballastd reads another; OK when they agree.
absl::Status CheckSchemaVersion(const std::string& where, int64_t found);

// A job as one row of the jobs table.
struct JobRow {
  int64_t order = 0;
  std::string id;
  // ScopedRequestId, unique among jobs; nullopt (NULL) when the job has no
  // request_id, so such jobs never collide.
  std::optional<std::string> request_id;
  int32_t state = 0;
  int32_t priority = 0;
  int32_t attempt = 0;
  // resume_at_or_before as the column holds it (ResumeColumn).
  int64_t resume_at_or_before = 0;
  int64_t events_deleted = 0;
  // The serialized v1::Job.
  std::string job;
  std::string tenant;
  bool evicted = false;
  // The write deletes this job's events with seq <= this (retention); 0
  // deletes none.
  int64_t trim_events_through = 0;
};

// The row `change` writes, keeping the newest `retention` events.
JobRow EncodeJobRow(const StoreBatch::JobChange& change, int64_t retention);

// The columns DecodeJobRow reads, in its order, for a SELECT.
inline constexpr char kRecordColumns[] =
    "ord, attempt, resume_at_or_before, events_deleted, evicted, job";

// A record from the values of kRecordColumns; DATA_LOSS when the job does
// not parse.
absl::StatusOr<JobRecord> DecodeJobRow(int64_t order, int32_t attempt, int64_t resume_column,
                                       int64_t events_deleted, bool evicted, std::string_view job);

// The error of a write whose job's request_id the database found taken.
absl::Status RequestIdTaken(const v1::Job& job);

// `url` with any password replaced by "***", for messages and logs.
std::string RedactStoreUrl(std::string_view url);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STORE_ROWS_H_
