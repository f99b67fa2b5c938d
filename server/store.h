// Durable store of the coordinator: jobs, their events, and workers, in
// SQLite (WAL mode). The coordinator keeps its working state in memory and
// writes every change through this store, so a restart loses no job.
//
// Thread-safe: one connection for writes behind a mutex, each call one
// transaction, and one for reads of what is committed behind another.
// Checkpoints (copying the WAL back into the database, with an fsync) run
// on a thread and connection of their own, so no commit waits for one.
// Writes come in batches, and one Write takes many (server/commit_queue.h
// gathers those of concurrent callers).
#ifndef BALLAST_SERVER_STORE_H_
#define BALLAST_SERVER_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_service.pb.h"
#include "ballast/v1/token_service.pb.h"

struct sqlite3;
struct sqlite3_stmt;

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

class Store {
 public:
  // Opens (creating if needed) the store at `url`, "sqlite:PATH". The parent
  // folder must exist. INVALID_ARGUMENT for another scheme, UNAVAILABLE when
  // the database cannot be opened.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& url);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // OK when the database answers a query.
  absl::Status Ping();

  // Writes `batches` in one transaction, all or nothing: each job inserted or
  // replaced with its new events, then its events beyond the newest
  // `retention` deleted; each worker inserted or replaced. ALREADY_EXISTS
  // when a job's request_id belongs to another job; UNAVAILABLE when the
  // database fails.
  absl::Status Write(absl::Span<const StoreBatch* const> batches, int64_t retention);

  // Every job not evicted, in submission order.
  absl::StatusOr<std::vector<JobRecord>> LoadJobs();

  // The highest submission order of any job, evicted or not; 0 when none.
  absl::StatusOr<int64_t> LastJobOrder();

  // The job `job_id`, evicted or not; nullopt when there is none.
  absl::StatusOr<std::optional<JobRecord>> ReadJob(const std::string& job_id);

  // Evicted jobs by state.
  absl::StatusOr<std::map<int, int64_t>> CountEvictedJobs();

  // Deletes the oldest evicted jobs, with their events, beyond the newest
  // `keep` evicted ones: at most `limit` of them, in one transaction, so a
  // long history is pruned a bit at a time between commits. Returns the
  // deleted jobs by state.
  absl::StatusOr<std::map<int, int64_t>> PruneEvictedJobs(int64_t keep, int64_t limit);

  // The id of the job submitted with ScopedRequestId(tenant, request_id);
  // nullopt when there is none.
  absl::StatusOr<std::optional<std::string>> JobOfRequest(const std::string& scoped_request_id);

  // Up to `limit` evicted jobs with order < before_order, newest first; of
  // `tenant` alone unless it is empty, and in `states` unless it is empty.
  absl::StatusOr<std::vector<JobRecord>> ListEvictedJobs(int64_t before_order,
                                                         const std::set<int>& states,
                                                         const std::string& tenant, int limit);

  // Up to `limit` events of `job_id` with seq > after_seq, in seq order.
  absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t after_seq,
                                                       int limit);

  // Every worker, by id.
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers();

  // Inserts or replaces a token (a revocation rewrites it).
  absl::Status PutToken(const TokenRecord& record);

  // Every token, oldest first.
  absl::StatusOr<std::vector<TokenRecord>> LoadTokens();

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  // Checkpoints `path` whenever a commit has left the WAL long, until
  // the store closes.
  void CheckpointLoop(const std::string& path);
  // SQLite's hook after each commit, with the WAL's length in pages.
  static int AfterCommit(void* store, sqlite3* db, const char* name, int wal_pages);
  absl::Status Prepare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the read connection and prepares its statements.
  absl::Status OpenReader(const std::string& path) ABSL_LOCKS_EXCLUDED(read_mu_);
  // Adds the columns a store from before eviction lacks (kEvictionColumns).
  absl::Status AddMissingJobColumns() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DATA_LOSS naming `path` when SQLite's quick_check finds damage.
  absl::Status CheckIntegrity(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteJob(const StoreBatch::JobChange& change, int64_t retention)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteWorker(const WorkerRecord& record) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Prepared once, reset after each use.
  sqlite3_stmt* put_job_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* insert_event_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* trim_events_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* put_worker_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Reads of what is committed (WAL readers never wait for the writer): a
  // GetJob of an evicted job, a watch's replay or a new job id's check does
  // not wait for a group commit under way.
  absl::Mutex read_mu_;
  sqlite3* reader_ ABSL_GUARDED_BY(read_mu_) = nullptr;
  sqlite3_stmt* read_job_ ABSL_GUARDED_BY(read_mu_) = nullptr;
  sqlite3_stmt* job_of_request_ ABSL_GUARDED_BY(read_mu_) = nullptr;
  sqlite3_stmt* read_events_ ABSL_GUARDED_BY(read_mu_) = nullptr;

  absl::Mutex checkpoint_mu_;
  bool checkpoint_due_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  bool closing_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  std::thread checkpointer_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STORE_H_
