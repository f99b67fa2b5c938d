// Durable store of the coordinator: jobs, their events, and workers, in
// SQLite (WAL mode). The coordinator keeps its working state in memory and
// writes every change through this store, so a restart loses no job.
//
// Thread-safe: one connection behind a mutex; each call is one transaction.
#ifndef BALLAST_SERVER_STORE_H_
#define BALLAST_SERVER_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
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
  // Events removed by retention, for this job.
  int64_t events_deleted = 0;
};

struct WorkerRecord {
  v1::Worker worker;
  // Highest ReportEvents report_id accepted from this worker.
  int64_t last_report_id = 0;
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

  // Inserts a new job. ALREADY_EXISTS when its id or non-empty request_id is
  // taken.
  absl::Status InsertJob(const JobRecord& record);

  // Writes a job's new state together with its new events, in one
  // transaction, then deletes the job's events beyond the newest `retention`
  // and adds their number to record->events_deleted. Returns how many were
  // deleted now.
  absl::StatusOr<int64_t> UpdateJob(JobRecord* record, const std::vector<v1::JobEvent>& events,
                                    int64_t retention);

  // Every job, in submission order.
  absl::StatusOr<std::vector<JobRecord>> LoadJobs();

  // Up to `limit` events of `job_id` with seq > after_seq, in seq order.
  absl::StatusOr<std::vector<v1::JobEvent>> ReadEvents(const std::string& job_id, int64_t after_seq,
                                                       int limit);

  // Inserts or replaces a worker.
  absl::Status PutWorker(const WorkerRecord& record);

  // Every worker, by id.
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers();

  // Inserts or replaces a token (a revocation rewrites it).
  absl::Status PutToken(const TokenRecord& record);

  // Every token, oldest first.
  absl::StatusOr<std::vector<TokenRecord>> LoadTokens();

 private:
  explicit Store(sqlite3* db) : db_(db) {}
  absl::Status Prepare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DATA_LOSS naming `path` when SQLite's quick_check finds damage.
  absl::Status CheckIntegrity(const std::string& path) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteJob(const JobRecord& record, sqlite3_stmt* stmt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  // Prepared once, reset after each use.
  sqlite3_stmt* insert_job_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* update_job_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* insert_event_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* trim_events_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* read_events_ ABSL_GUARDED_BY(mu_) = nullptr;
  sqlite3_stmt* put_worker_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_STORE_H_
