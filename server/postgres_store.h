// The store in PostgreSQL, through libpq: "postgresql://..." or
// "postgres://..." (libpq's connection URI: user, host or a socket folder as
// ?host=DIR, port, database, sslmode, ...). Several ballastd hosts can reach
// it, which SQLite's file cannot offer; same semantics as SqliteStore.
//
// One connection for writes behind a mutex, each Write one transaction whose
// rows go in libpq's pipeline mode (BEGIN, then a round trip per 256
// statements rather than per row, then COMMIT), and
// one for reads of what is committed behind another, so a watch's replay
// never waits for a group commit. A connection that broke (the server
// restarted) is reopened at its next use; the call that found it broken
// fails UNAVAILABLE, as a failed SQLite write does.
//
// The schema is made at the first open, under an advisory lock so two
// ballastd starting at once do not race, with its version in the row of
// ballast_schema; a store of another version is refused, so a later
// migration finds what it starts from. Leader election (a second
// coordinator on standby) will fence writes by an epoch kept beside that
// version: every change goes through Write's one transaction, which is where
// a deposed coordinator's epoch would be checked and its write refused.
#ifndef BALLAST_SERVER_POSTGRES_STORE_H_
#define BALLAST_SERVER_POSTGRES_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "server/store.h"

namespace ballast::server {

class PostgresStore : public Store {
 public:
  // Connects to `url` (twice: writes and reads) and makes the schema if the
  // database has none. UNAVAILABLE naming the URL, without its password, when
  // the server cannot be reached or refuses; FAILED_PRECONDITION when the
  // database holds a schema of another version.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& url);
  // OK when no connection to `url`'s database is a PostgresStore's (named
  // ballastd in pg_stat_activity); FAILED_PRECONDITION counting them and
  // naming their hosts otherwise, UNAVAILABLE as Open.
  static absl::Status CheckNotInUse(const std::string& url);
  ~PostgresStore() override;
  PostgresStore(const PostgresStore&) = delete;
  PostgresStore& operator=(const PostgresStore&) = delete;

  absl::Status Ping() override;
  absl::Status Write(absl::Span<const StoreBatch* const> batches, int64_t retention) override;
  absl::StatusOr<std::vector<JobRecord>> LoadJobs() override;
  absl::StatusOr<int64_t> LastJobOrder() override;
  absl::StatusOr<std::optional<JobRecord>> ReadJob(const std::string& job_id) override;
  absl::StatusOr<std::map<int, int64_t>> CountEvictedJobs() override;
  absl::StatusOr<std::map<int, int64_t>> PruneEvictedJobs(int64_t keep, int64_t limit) override;
  absl::StatusOr<std::optional<std::string>> JobOfRequest(
      const std::string& scoped_request_id) override;
  absl::StatusOr<std::vector<JobRecord>> ListEvictedJobs(int64_t before_order,
                                                         const std::set<int>& states,
                                                         const std::string& tenant,
                                                         int limit) override;
  absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t after_seq,
                                                       int limit) override;
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() override;
  absl::Status PutToken(const TokenRecord& record) override;
  absl::StatusOr<std::vector<TokenRecord>> LoadTokens() override;

  // One libpq connection (server/postgres_store.cc).
  class Connection;

 private:
  PostgresStore(std::unique_ptr<Connection> writer, std::unique_ptr<Connection> reader);

  absl::Mutex mu_;
  std::unique_ptr<Connection> writer_ ABSL_GUARDED_BY(mu_);
  absl::Mutex read_mu_;
  std::unique_ptr<Connection> reader_ ABSL_GUARDED_BY(read_mu_);
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_POSTGRES_STORE_H_
