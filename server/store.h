// Durable store of the coordinator: jobs, their events, workers and API
// tokens. The coordinator keeps its working state in memory and writes every
// change through this store, so a restart loses no job. Writes come in
// batches, and one Write takes many (server/commit_queue.h gathers those of
// concurrent callers).
#ifndef BALLAST_SERVER_STORE_H_
#define BALLAST_SERVER_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_service.pb.h"
#include "ballast/v1/token_service.pb.h"

namespace ballast::server {

// The tenant of the bootstrap admin token, of an open ballastd, and of jobs
// stored before tenants existed.
inline constexpr char kDefaultTenant[] = "default";

// Idempotency keys are per tenant: the key under which a job's request_id
// is unique.
inline std::string ScopedRequestId(const std::string& tenant, const std::string& request_id) {
  return tenant + "/" + request_id;
}

// A job as stored: the API's Job plus what the coordinator keeps beside it.
struct JobRecord {
  v1::Job job;
  // Submission order, 1, 2, ...; ListJobs pages by it.
  int64_t order = 0;
  // Times the job was scheduled; assignments carry it.
  int32_t attempt = 0;
  // A rollback's target, passed to the next attempt
  // (Assignment.resume_at_or_before), then reset; 0 starts over.
  std::optional<int64_t> resume_at_or_before;
  // Events of this job that retention pushed out: the write carrying this
  // count deletes them.
  int64_t events_deleted = 0;
  // Out of the coordinator's memory: finished, and no longer among the
  // recently finished jobs. Reads of it come from the store.
  bool evicted = false;
};

struct WorkerRecord {
  v1::Worker worker;
  // Highest ReportEvents report_id accepted from this worker.
  int64_t last_report_id = 0;
};

// Changes that are stored together or not at all.
struct StoreBatch {
  // A job's whole record, with the events made since it was last written.
  struct JobChange {
    JobRecord record;
    std::vector<v1::JobEvent> events;
  };
  std::vector<JobChange> jobs;
  std::vector<WorkerRecord> workers;
};

// An API token as stored: its public part and the SHA-256 of its secret,
// never the secret.
struct TokenRecord {
  v1::Token token;
  std::string secret_sha256;
};

// Who leads the coordinators that share a store: the holder of its lease,
// at an epoch that each takeover raises by one.
struct LeaderLease {
  // 1, 2, ...: the takeovers so far, plus one.
  int64_t epoch = 0;
  // The leader's holder id and its gRPC address, as it gave them to Lead.
  std::string holder;
  std::string address;
  // The caller holds the lease (it led already, or has just taken it).
  bool mine = false;
};

// The coordinator's durable store. Two implementations with the same
// semantics: SqliteStore (server/sqlite_store.h, the default) and
// PostgresStore (server/postgres_store.h). What a row holds, and the
// retention rule, are theirs in common (server/store_rows.h); only SQL and
// its execution differ.
//
// Implementations are thread-safe, and every call is one transaction:
// reads see what is committed.
class Store {
 public:
  // Opens (creating its schema if needed) the store at `url`: "sqlite:PATH"
  // (the parent folder must exist), or "postgresql://..." / "postgres://..."
  // (libpq's connection URI). INVALID_ARGUMENT for another scheme,
  // UNAVAILABLE when the database cannot be opened; errors name the URL
  // without its password.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& url);

  // OK when `url` has one of the schemes above; INVALID_ARGUMENT naming it,
  // without its password, after `key` (the flag or argument that gave it).
  static absl::Status CheckUrl(const std::string& url, absl::string_view key);

  // OK when no other process has the store at `url` open: a SQLite file no
  // SqliteStore holds (each holds a shared flock on it while open), a
  // PostgreSQL database without a connection named ballastd. FAILED_PRECONDITION
  // saying what holds it otherwise; INVALID_ARGUMENT and UNAVAILABLE as Open.
  // For a copy of the whole store (server/store_migration.h), which a running
  // ballastd would change under it.
  static absl::Status CheckNotInUse(const std::string& url);
  virtual ~Store() = default;

  // OK when the database answers a query.
  virtual absl::Status Ping() = 0;

  // Writes `batches` in one transaction, all or nothing: each job inserted or
  // replaced with its new events, then its events beyond the newest
  // `retention` deleted; each worker inserted or replaced. ALREADY_EXISTS
  // when a job's request_id belongs to another job; UNAVAILABLE when the
  // database fails.
  virtual absl::Status Write(absl::Span<const StoreBatch* const> batches, int64_t retention) = 0;

  // Every job not evicted, in submission order.
  virtual absl::StatusOr<std::vector<JobRecord>> LoadJobs() = 0;

  // The highest submission order of any job, evicted or not; 0 when none.
  virtual absl::StatusOr<int64_t> LastJobOrder() = 0;

  // The job `job_id`, evicted or not; nullopt when there is none.
  virtual absl::StatusOr<std::optional<JobRecord>> ReadJob(const std::string& job_id) = 0;

  // Evicted jobs by state.
  virtual absl::StatusOr<std::map<int, int64_t>> CountEvictedJobs() = 0;

  // Deletes the oldest evicted jobs, with their events, beyond the newest
  // `keep` evicted ones: at most `limit` of them, in one transaction, so a
  // long history is pruned a bit at a time between commits. Returns the
  // deleted jobs by state.
  virtual absl::StatusOr<std::map<int, int64_t>> PruneEvictedJobs(int64_t keep, int64_t limit) = 0;

  // The id of the job submitted with ScopedRequestId(tenant, request_id);
  // nullopt when there is none.
  virtual absl::StatusOr<std::optional<std::string>> JobOfRequest(
      const std::string& scoped_request_id) = 0;

  // Up to `limit` evicted jobs with order < before_order, newest first; of
  // `tenant` alone unless it is empty, and in `states` unless it is empty.
  virtual absl::StatusOr<std::vector<JobRecord>> ListEvictedJobs(int64_t before_order,
                                                                 const std::set<int>& states,
                                                                 const std::string& tenant,
                                                                 int limit) = 0;

  // Up to `limit` events of `job_id` with seq > after_seq, in seq order.
  virtual absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(const std::string& job_id,
                                                               int64_t after_seq, int limit) = 0;

  // Every worker, by id.
  virtual absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() = 0;

  // Inserts or replaces a token (a revocation rewrites it).
  virtual absl::Status PutToken(const TokenRecord& record) = 0;

  // Every token, oldest first.
  virtual absl::StatusOr<std::vector<TokenRecord>> LoadTokens() = 0;

  // --- Leadership (docs/control-plane.md, "Two coordinators") ---

  // Whether several coordinators may share this store, one leading and the
  // others on standby (PostgreSQL); false for one coordinator alone (SQLite).
  virtual bool Shared() const = 0;

  // Renews the lease of `holder` (a ballastd's id, unique per process) for
  // `lease_ms` on the database's clock, or takes it when no one holds it or
  // its holder let it expire (epoch + 1); else returns who holds it, with
  // mine false. From the first call on, every write of this store (Write,
  // PutToken, PruneEvictedJobs) first checks within its transaction that its
  // epoch is still the current one, and fails ABORTED, "deposed: epoch N,
  // the leader is now ADDRESS", once another holder took the lease: a
  // deposed coordinator's late write is refused by the database. A store
  // never led (tests, benchmarks, one ballastd) is not fenced.
  // UNAVAILABLE when the database fails; FAILED_PRECONDITION from a store
  // that is not Shared when another process leads it.
  virtual absl::StatusOr<LeaderLease> Lead(const std::string& holder, const std::string& address,
                                           int64_t lease_ms) = 0;
  // Ends the lease of `holder` at once, if it holds it, so that a standby
  // (or this ballastd restarted) need not wait for it to expire; this store
  // writes nothing more. Called once a leader has stopped serving.
  virtual absl::Status Resign(const std::string& holder) = 0;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STORE_H_
