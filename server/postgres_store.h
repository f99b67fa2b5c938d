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
// migration finds what it starts from.
//
// Leadership: the one row of ballast_leader holds the lease of the leading
// coordinator (holder, address, epoch, expires_at on the database's clock,
// so the hosts' clocks do not matter). Lead renews or takes it on a
// connection of its own, so a renewal never waits behind a long write, in
// one statement that may wait no longer than a lease (lock_timeout). Once
// this store has led, each write transaction begins by reading that row
// FOR SHARE (FenceWrites): a takeover's UPDATE waits for the writes under
// way, and a write after it sees the new epoch and is refused, ABORTED.
// A transaction may not idle longer than the lease
// (idle_in_transaction_session_timeout), so a frozen leader's open
// transaction cannot hold a takeover back.
#ifndef BALLAST_SERVER_POSTGRES_STORE_H_
#define BALLAST_SERVER_POSTGRES_STORE_H_

#include <atomic>
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
  bool Shared() const override { return true; }
  absl::StatusOr<LeaderLease> Lead(const std::string& holder, const std::string& address,
                                   int64_t lease_ms) override;
  absl::Status Resign(const std::string& holder) override;

  // One libpq connection (server/postgres_store.cc).
  class Connection;

 private:
  PostgresStore(std::string url, std::unique_ptr<Connection> writer,
                std::unique_ptr<Connection> reader);
  // Within a write transaction, before its first change: OK when this store
  // never led, or its epoch is still the lease's; ABORTED naming the
  // leader else. Holds the lease row FOR SHARE until the transaction ends.
  absl::Status FenceWrites() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<Connection> writer_ ABSL_GUARDED_BY(mu_);
  absl::Mutex read_mu_;
  std::unique_ptr<Connection> reader_ ABSL_GUARDED_BY(read_mu_);
  const std::string url_;
  // Lead's connection, opened at its first call.
  absl::Mutex lead_mu_;
  std::unique_ptr<Connection> leader_ ABSL_GUARDED_BY(lead_mu_);
  // Set by Lead: whether writes are fenced, the epoch they carry (0 while
  // this store does not lead) and the lease, which bounds how long a
  // transaction may idle.
  std::atomic<bool> fenced_{false};
  std::atomic<int64_t> epoch_{0};
  std::atomic<int64_t> lease_ms_{0};
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_POSTGRES_STORE_H_
