// The store in SQLite (WAL mode), ballastd's default: "sqlite:PATH".
//
// One connection for writes behind a mutex, each call one transaction, and
// one for reads of what is committed behind another. Checkpoints (copying
// the WAL back into the database, with an fsync) run on a thread and
// connection of their own, so no commit waits for one.
#ifndef BALLAST_SERVER_SQLITE_STORE_H_
#define BALLAST_SERVER_SQLITE_STORE_H_

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
#include "server/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace ballast::server {

class SqliteStore : public Store {
 public:
  // Opens (creating if needed) the database file `path`; its folder must
  // exist. UNAVAILABLE when it cannot be opened, DATA_LOSS when it is damaged.
  // Holds a shared flock on the file while open (several SqliteStores may
  // share it), so CheckNotInUse can tell that one is.
  static absl::StatusOr<std::unique_ptr<Store>> Open(const std::string& path);
  // OK when no SqliteStore of any process has `path` open (or there is no
  // such file); FAILED_PRECONDITION naming it when one has.
  static absl::Status CheckNotInUse(const std::string& path);
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

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
  // One coordinator per file: Lead takes an exclusive flock(2) on
  // PATH.coordinator-lock beside the database (made if missing) for the
  // store's life, and FAILED_PRECONDITION while another holds it. The lease
  // is then always this store's, at epoch 1.
  bool Shared() const override { return false; }
  absl::StatusOr<LeaderLease> Lead(const std::string& holder, const std::string& address,
                                   int64_t lease_ms) override;
  absl::Status Resign(const std::string& holder) override;

 private:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  // Checkpoints `path` whenever a commit has left the WAL long, until
  // the store closes.
  void CheckpointLoop(const std::string& path);
  // SQLite's hook after each commit, with the WAL's length in pages.
  static int AfterCommit(void* store, sqlite3* db, const char* name, int wal_pages);
  // Takes the shared flock on `path` that CheckNotInUse looks for.
  absl::Status HoldSharedLock(const std::string& path);
  absl::Status Prepare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Opens the read connection and prepares its statements.
  absl::Status OpenReader(const std::string& path) ABSL_LOCKS_EXCLUDED(read_mu_);
  // The one integer `sql` selects; `what` names it in errors.
  absl::StatusOr<int64_t> QueryInt(const char* sql, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
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

  // PATH.coordinator-lock, flock'ed by the first Lead; -1 before.
  absl::Mutex lead_mu_;
  int lead_fd_ ABSL_GUARDED_BY(lead_mu_) = -1;

  absl::Mutex checkpoint_mu_;
  bool checkpoint_due_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  bool closing_ ABSL_GUARDED_BY(checkpoint_mu_) = false;
  std::thread checkpointer_;
  // The file's descriptor that holds Open's shared flock; -1 before.
  int lock_fd_ = -1;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_SQLITE_STORE_H_
