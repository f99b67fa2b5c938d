#include "server/sqlite_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/store_rows.h"

namespace ballast::server {
namespace {

// WAL pages after which a checkpoint is due: SQLite's own default.
constexpr int kCheckpointPages = 1000;

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS jobs (
  ord INTEGER PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  resume_at_or_before INTEGER NOT NULL,
  events_deleted INTEGER NOT NULL,
  job BLOB NOT NULL,
  tenant TEXT,
  evicted INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state, priority DESC, ord);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq INTEGER NOT NULL,
  event BLOB NOT NULL,
  PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY,
  last_report_id INTEGER NOT NULL,
  worker BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
  id TEXT PRIMARY KEY,
  created_ms INTEGER NOT NULL,
  secret_sha256 BLOB NOT NULL,
  token BLOB NOT NULL);
)sql";

// Stores made before jobs could leave ballastd's memory lack the last two
// columns of jobs; they are added, empty, at open. Every job of such a store
// is then in memory (evicted = 0), and each gets its tenant when it is
// written next, at the latest when it is evicted.
constexpr char kEvictionColumns[] =
    "ALTER TABLE jobs ADD COLUMN tenant TEXT; "
    "ALTER TABLE jobs ADD COLUMN evicted INTEGER NOT NULL DEFAULT 0";

// ListJobs reads evicted jobs newest first, of one tenant or of all.
constexpr char kEvictedIndexes[] =
    "CREATE INDEX IF NOT EXISTS evicted_jobs ON jobs(ord) WHERE evicted = 1; "
    "CREATE INDEX IF NOT EXISTS evicted_jobs_by_tenant ON jobs(tenant, ord) WHERE evicted = 1";

// A job's first write inserts it; later ones replace what changes (its
// submission order and request_id never do).
constexpr char kPutJob[] =
    "INSERT INTO jobs (ord, id, request_id, state, priority, attempt, resume_at_or_before, "
    "events_deleted, job, tenant, evicted) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) "
    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, priority = excluded.priority, "
    "attempt = excluded.attempt, resume_at_or_before = excluded.resume_at_or_before, "
    "events_deleted = excluded.events_deleted, job = excluded.job, tenant = excluded.tenant, "
    "evicted = excluded.evicted";

// Resets a prepared statement when it leaves scope, on every path.
class Reset {
 public:
  explicit Reset(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

 private:
  sqlite3_stmt* stmt_;
};

void BindText(sqlite3_stmt* stmt, int index, const std::string& text) {
  sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
}

void BindBlob(sqlite3_stmt* stmt, int index, const std::string& bytes) {
  sqlite3_bind_blob(stmt, index, bytes.data(), static_cast<int>(bytes.size()), SQLITE_TRANSIENT);
}

template <typename Proto>
bool ParseBlob(sqlite3_stmt* stmt, int column, Proto* out) {
  const void* data = sqlite3_column_blob(stmt, column);
  const int size = sqlite3_column_bytes(stmt, column);
  return out->ParseFromArray(data, size);
}

absl::Status DbError(sqlite3* db, const char* what) {
  return absl::UnavailableError(absl::StrCat("store: ", what, ": ", sqlite3_errmsg(db)));
}

// The job of a row selected with kRecordColumns; DATA_LOSS when it does not parse.
absl::StatusOr<JobRecord> RecordFromRow(sqlite3_stmt* stmt) {
  const auto* job = static_cast<const char*>(sqlite3_column_blob(stmt, 5));
  return DecodeJobRow(sqlite3_column_int64(stmt, 0), sqlite3_column_int(stmt, 1),
                      sqlite3_column_int64(stmt, 2), sqlite3_column_int64(stmt, 3),
                      sqlite3_column_int(stmt, 4) != 0,
                      std::string_view(job, static_cast<size_t>(sqlite3_column_bytes(stmt, 5))));
}

// Steps `stmt`, a query of kRecordColumns on `db`, to its end, then
// finalizes it.
absl::StatusOr<std::vector<JobRecord>> ReadRecords(sqlite3* db, sqlite3_stmt* stmt,
                                                   const char* what) {
  std::vector<JobRecord> jobs;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    absl::StatusOr<JobRecord> r = RecordFromRow(stmt);
    if (!r.ok()) {
      sqlite3_finalize(stmt);
      return r.status();
    }
    jobs.push_back(*std::move(r));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return DbError(db, what);
  return jobs;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> SqliteStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("store ", path, ": ", message));
  }
  std::unique_ptr<SqliteStore> store(new SqliteStore(db));
  absl::MutexLock lock(&store->mu_);
  // Another process (a second ballastd, the sqlite3 shell) may hold the lock
  // briefly; wait for it rather than fail.
  sqlite3_busy_timeout(db, 5000);
  // WAL: readers never block the writer. synchronous=NORMAL: a commit is
  // durable across a crash of ballastd (the WAL is in the OS's hands); only a
  // power loss can take back the last commits, which costs one fsync less per
  // event.
  if (absl::Status s = store->CheckIntegrity(path); !s.ok()) return s;
  for (const char* pragma :
       {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON"}) {
    if (absl::Status s = store->Exec(pragma); !s.ok()) return s;
  }
  // user_version 0: a new store, or one from before versions, which the
  // steps below bring to version 1.
  absl::StatusOr<int64_t> version = store->QueryInt("PRAGMA user_version", "schema version");
  if (!version.ok()) return version.status();
  if (*version != 0) {
    if (absl::Status s = CheckSchemaVersion(absl::StrCat("store ", path), *version); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = store->Exec(kSchema); !s.ok()) return s;
  if (absl::Status s = store->AddMissingJobColumns(); !s.ok()) return s;
  if (absl::Status s = store->Exec(kEvictedIndexes); !s.ok()) return s;
  if (*version == 0) {
    const std::string set = absl::StrCat("PRAGMA user_version = ", kSchemaVersion);
    if (absl::Status s = store->Exec(set.c_str()); !s.ok()) return s;
  }
  if (absl::Status s = store->HoldSharedLock(path); !s.ok()) return s;
  if (absl::Status s = store->Prepare(); !s.ok()) return s;
  if (absl::Status s = store->OpenReader(path); !s.ok()) return s;
  // Replaces SQLite's checkpoint at commit, which made every thousandth
  // commit wait for two fsyncs.
  sqlite3_wal_hook(db, &SqliteStore::AfterCommit, store.get());
  store->checkpointer_ = std::thread([raw = store.get(), path] { raw->CheckpointLoop(path); });
  return store;
}

// flock, not SQLite's own POSIX locks: a ballastd between transactions holds
// none of those, and flock's locks are apart from them on Linux, so SQLite's
// locking is untouched.
absl::Status SqliteStore::HoldSharedLock(const std::string& path) {
  lock_fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (lock_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("store ", path, ": ", std::strerror(errno)));
  }
  if (flock(lock_fd_, LOCK_SH | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("store ", path, " is locked by a copy of the store (ballastd migrate-store)"));
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::CheckNotInUse(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("store ", path, ": ", std::strerror(errno)));
  }
  const bool unused = flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd);
  if (unused) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("store sqlite:", path,
                   " is open in another process (a running ballastd?): its file is locked; stop "
                   "that process first"));
}

int SqliteStore::AfterCommit(void* store, sqlite3*, const char*, int wal_pages) {
  if (wal_pages >= kCheckpointPages) {
    auto* self = static_cast<SqliteStore*>(store);
    absl::MutexLock lock(&self->checkpoint_mu_);
    self->checkpoint_due_ = true;
  }
  return SQLITE_OK;
}

void SqliteStore::CheckpointLoop(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK) {
    std::fprintf(stderr, "ballastd: store %s: no connection for checkpoints: %s\n", path.c_str(),
                 sqlite3_errmsg(db));
  }
  // A connection that has read nothing yet has not opened the WAL, and its
  // checkpoints do nothing (they report "not in WAL mode"): the WAL grew
  // without bound, and the database file stayed empty, until this read.
  if (sqlite3_exec(db, "SELECT COUNT(*) FROM sqlite_master", nullptr, nullptr, nullptr) !=
      SQLITE_OK) {
    std::fprintf(stderr, "ballastd: store %s: checkpoints cannot read it: %s\n", path.c_str(),
                 sqlite3_errmsg(db));
  }
  auto due_or_closing = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(checkpoint_mu_) {
    return checkpoint_due_ || closing_;
  };
  while (true) {
    {
      absl::MutexLock lock(&checkpoint_mu_);
      checkpoint_mu_.Await(absl::Condition(&due_or_closing));
      if (closing_) break;
      checkpoint_due_ = false;
    }
    // Passive: copies what no reader still needs, beside the writer, and
    // never waits for a lock; the next due checkpoint takes the rest.
    sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  }
  sqlite3_close(db);
}

SqliteStore::~SqliteStore() {
  {
    absl::MutexLock lock(&lead_mu_);
    if (lead_fd_ >= 0) ::close(lead_fd_);
  }
  {
    absl::MutexLock lock(&checkpoint_mu_);
    closing_ = true;
  }
  if (checkpointer_.joinable()) checkpointer_.join();
  {
    absl::MutexLock lock(&read_mu_);
    for (sqlite3_stmt* stmt : {read_job_, job_of_request_, read_events_}) sqlite3_finalize(stmt);
    sqlite3_close(reader_);
  }
  absl::MutexLock lock(&mu_);
  for (sqlite3_stmt* stmt : {put_job_, insert_event_, trim_events_, put_worker_}) {
    sqlite3_finalize(stmt);
  }
  sqlite3_close(db_);
  if (lock_fd_ >= 0) close(lock_fd_);
}

absl::Status SqliteStore::Error(const char* what) { return DbError(db_, what); }

absl::Status SqliteStore::CheckIntegrity(const std::string& path) {
  // A damaged page found now stops ballastd with a message; found later, it
  // would fail some write in the middle of a job's life.
  std::vector<std::string> problems;
  char* message = nullptr;
  const int rc = sqlite3_exec(
      db_, "PRAGMA quick_check(8)",
      [](void* out, int, char** values, char**) {
        auto* list = static_cast<std::vector<std::string>*>(out);
        if (values[0] != nullptr && std::string_view(values[0]) != "ok") list->push_back(values[0]);
        return 0;
      },
      &problems, &message);
  if (rc != SQLITE_OK) {
    problems.push_back(message != nullptr ? message : sqlite3_errstr(rc));
    sqlite3_free(message);
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "store ", path, " is damaged (", absl::StrJoin(problems, "; "),
      "): ballastd will not run on it. Restore the newest backup (docs/deploy.md, Backing up "
      "the store), or move the file away to start empty"));
}

absl::Status SqliteStore::Exec(const char* sql) {
  char* message = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &message) != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat("store: ", sql, ": ", message));
    sqlite3_free(message);
    return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> SqliteStore::QueryInt(const char* sql, const char* what) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) return Error(what);
  const int rc = sqlite3_step(stmt);
  const int64_t value = rc == SQLITE_ROW ? sqlite3_column_int64(stmt, 0) : 0;
  sqlite3_finalize(stmt);
  if (rc != SQLITE_ROW) return Error(what);
  return value;
}

absl::Status SqliteStore::AddMissingJobColumns() {
  bool has_evicted = false;
  char* message = nullptr;
  const int rc = sqlite3_exec(
      db_, "PRAGMA table_info(jobs)",
      [](void* out, int columns, char** values, char** names) {
        for (int i = 0; i < columns; ++i) {
          if (std::string_view(names[i]) == "name" && values[i] != nullptr &&
              std::string_view(values[i]) == "evicted") {
            *static_cast<bool*>(out) = true;
          }
        }
        return 0;
      },
      &has_evicted, &message);
  if (rc != SQLITE_OK) {
    absl::Status s = absl::UnavailableError(absl::StrCat("store: table_info(jobs): ", message));
    sqlite3_free(message);
    return s;
  }
  if (has_evicted) return absl::OkStatus();
  // Both columns or neither: a store left with one would not open again.
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  absl::Status added = Exec(kEvictionColumns);
  if (added.ok()) added = Exec("COMMIT");
  if (!added.ok()) (void)Exec("ROLLBACK");
  return added;
}

absl::Status SqliteStore::Prepare() {
  const std::pair<const char*, sqlite3_stmt**> statements[] = {
      {kPutJob, &put_job_},
      {"INSERT OR REPLACE INTO events (job_id, seq, event) VALUES (?1, ?2, ?3)", &insert_event_},
      {"DELETE FROM events WHERE job_id = ?1 AND seq <= ?2", &trim_events_},
      {"INSERT OR REPLACE INTO workers (id, last_report_id, worker) VALUES (?1, ?2, ?3)",
       &put_worker_},
  };
  for (const auto& [sql, stmt] : statements) {
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, stmt, nullptr) != SQLITE_OK) {
      return Error(sql);
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::OpenReader(const std::string& path) {
  absl::MutexLock lock(&read_mu_);
  if (sqlite3_open_v2(path.c_str(), &reader_, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    return DbError(reader_, "open the read connection");
  }
  sqlite3_busy_timeout(reader_, 5000);
  const std::string read_job = absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE id = ?1");
  const std::pair<const char*, sqlite3_stmt**> statements[] = {
      {read_job.c_str(), &read_job_},
      {"SELECT id FROM jobs WHERE request_id = ?1", &job_of_request_},
      {"SELECT event FROM events WHERE job_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
       &read_events_},
  };
  for (const auto& [sql, stmt] : statements) {
    if (sqlite3_prepare_v3(reader_, sql, -1, SQLITE_PREPARE_PERSISTENT, stmt, nullptr) !=
        SQLITE_OK) {
      return DbError(reader_, sql);
    }
  }
  return absl::OkStatus();
}

absl::Status SqliteStore::Ping() {
  absl::MutexLock lock(&mu_);
  return Exec("SELECT 1");
}

absl::Status SqliteStore::WriteJob(const StoreBatch::JobChange& change, int64_t retention) {
  const JobRow row = EncodeJobRow(change, retention);
  for (const v1::JobEvent& e : change.events) {
    Reset reset(insert_event_);
    BindText(insert_event_, 1, e.job_id());
    sqlite3_bind_int64(insert_event_, 2, e.seq());
    BindBlob(insert_event_, 3, e.SerializeAsString());
    if (sqlite3_step(insert_event_) != SQLITE_DONE) return Error("insert event");
  }
  if (row.trim_events_through > 0) {
    Reset reset(trim_events_);
    BindText(trim_events_, 1, row.id);
    sqlite3_bind_int64(trim_events_, 2, row.trim_events_through);
    if (sqlite3_step(trim_events_) != SQLITE_DONE) return Error("trim events");
  }
  Reset reset(put_job_);
  sqlite3_bind_int64(put_job_, 1, row.order);
  BindText(put_job_, 2, row.id);
  if (row.request_id) {
    BindText(put_job_, 3, *row.request_id);
  } else {
    sqlite3_bind_null(put_job_, 3);
  }
  sqlite3_bind_int(put_job_, 4, row.state);
  sqlite3_bind_int(put_job_, 5, row.priority);
  sqlite3_bind_int(put_job_, 6, row.attempt);
  sqlite3_bind_int64(put_job_, 7, row.resume_at_or_before);
  sqlite3_bind_int64(put_job_, 8, row.events_deleted);
  BindBlob(put_job_, 9, row.job);
  BindText(put_job_, 10, row.tenant);
  sqlite3_bind_int(put_job_, 11, row.evicted ? 1 : 0);
  const int rc = sqlite3_step(put_job_);
  // Only request_id's constraint is the client's doing; a clash of ord, the
  // store's own key, is a fault of ballastd and keeps SQLite's message.
  if (rc == SQLITE_CONSTRAINT && absl::StrContains(sqlite3_errmsg(db_), "jobs.request_id")) {
    return RequestIdTaken(change.record.job);
  }
  if (rc != SQLITE_DONE) return Error("write job");
  return absl::OkStatus();
}

absl::Status SqliteStore::WriteWorker(const WorkerRecord& record) {
  Reset reset(put_worker_);
  BindText(put_worker_, 1, record.worker.id());
  sqlite3_bind_int64(put_worker_, 2, record.last_report_id);
  BindBlob(put_worker_, 3, record.worker.SerializeAsString());
  if (sqlite3_step(put_worker_) != SQLITE_DONE) return Error("put worker");
  return absl::OkStatus();
}

absl::Status SqliteStore::Write(absl::Span<const StoreBatch* const> batches, int64_t retention) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  auto write = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    for (const StoreBatch* batch : batches) {
      for (const StoreBatch::JobChange& change : batch->jobs) {
        if (absl::Status s = WriteJob(change, retention); !s.ok()) return s;
      }
      for (const WorkerRecord& worker : batch->workers) {
        if (absl::Status s = WriteWorker(worker); !s.ok()) return s;
      }
    }
    return Exec("COMMIT");
  };
  absl::Status s = write();
  if (!s.ok()) (void)Exec("ROLLBACK");
  return s;
}

absl::StatusOr<std::vector<JobRecord>> SqliteStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  const std::string sql =
      absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE evicted = 0 ORDER BY ord");
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return Error("load jobs");
  }
  return ReadRecords(db_, stmt, "load jobs");
}

absl::StatusOr<int64_t> SqliteStore::LastJobOrder() {
  absl::MutexLock lock(&mu_);
  return QueryInt("SELECT COALESCE(MAX(ord), 0) FROM jobs", "last job order");
}

absl::StatusOr<std::map<int, int64_t>> SqliteStore::CountEvictedJobs() {
  absl::MutexLock lock(&read_mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(reader_,
                         "SELECT state, COUNT(*) FROM jobs WHERE evicted = 1 GROUP BY state", -1,
                         &stmt, nullptr) != SQLITE_OK) {
    return DbError(reader_, "count evicted jobs");
  }
  std::map<int, int64_t> counts;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    counts[sqlite3_column_int(stmt, 0)] = sqlite3_column_int64(stmt, 1);
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return DbError(reader_, "count evicted jobs");
  return counts;
}

absl::StatusOr<std::map<int, int64_t>> SqliteStore::PruneEvictedJobs(int64_t keep, int64_t limit) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = Exec("BEGIN IMMEDIATE"); !s.ok()) return s;
  std::map<int, int64_t> pruned;
  auto prune = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    // The oldest `limit` evicted jobs older than the newest `keep` ones.
    sqlite3_stmt* victims = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "SELECT id, state FROM jobs WHERE evicted = 1 AND ord <= "
                           "(SELECT ord FROM jobs WHERE evicted = 1 ORDER BY ord DESC "
                           "LIMIT 1 OFFSET ?1) ORDER BY ord LIMIT ?2",
                           -1, &victims, nullptr) != SQLITE_OK) {
      return Error("choose jobs to prune");
    }
    sqlite3_bind_int64(victims, 1, keep);
    sqlite3_bind_int64(victims, 2, limit);
    std::vector<std::string> ids;
    int rc;
    while ((rc = sqlite3_step(victims)) == SQLITE_ROW) {
      ids.emplace_back(reinterpret_cast<const char*>(sqlite3_column_text(victims, 0)));
      ++pruned[sqlite3_column_int(victims, 1)];
    }
    sqlite3_finalize(victims);
    if (rc != SQLITE_DONE) return Error("choose jobs to prune");
    for (const char* sql :
         {"DELETE FROM events WHERE job_id = ?1", "DELETE FROM jobs WHERE id = ?1"}) {
      sqlite3_stmt* del = nullptr;
      if (sqlite3_prepare_v2(db_, sql, -1, &del, nullptr) != SQLITE_OK) return Error("prune jobs");
      for (const std::string& id : ids) {
        BindText(del, 1, id);
        rc = sqlite3_step(del);
        sqlite3_reset(del);
        if (rc != SQLITE_DONE) break;
      }
      sqlite3_finalize(del);
      if (rc != SQLITE_DONE) return Error("prune jobs");
    }
    return Exec("COMMIT");
  };
  if (absl::Status s = prune(); !s.ok()) {
    (void)Exec("ROLLBACK");
    return s;
  }
  return pruned;
}

absl::StatusOr<std::optional<JobRecord>> SqliteStore::ReadJob(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  Reset reset(read_job_);
  BindText(read_job_, 1, job_id);
  const int rc = sqlite3_step(read_job_);
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) return DbError(reader_, "read job");
  absl::StatusOr<JobRecord> r = RecordFromRow(read_job_);
  if (!r.ok()) return r.status();
  return std::optional<JobRecord>(*std::move(r));
}

absl::StatusOr<std::optional<std::string>> SqliteStore::JobOfRequest(
    const std::string& scoped_request_id) {
  absl::MutexLock lock(&read_mu_);
  Reset reset(job_of_request_);
  BindText(job_of_request_, 1, scoped_request_id);
  const int rc = sqlite3_step(job_of_request_);
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) return DbError(reader_, "find request_id");
  return std::optional<std::string>(
      reinterpret_cast<const char*>(sqlite3_column_text(job_of_request_, 0)));
}

absl::StatusOr<std::vector<JobRecord>> SqliteStore::ListEvictedJobs(int64_t before_order,
                                                                    const std::set<int>& states,
                                                                    const std::string& tenant,
                                                                    int limit) {
  absl::MutexLock lock(&read_mu_);
  std::string sql =
      absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE evicted = 1 AND ord < ?1");
  if (!tenant.empty()) absl::StrAppend(&sql, " AND tenant = ?2");
  if (!states.empty()) absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(states, ", "), ")");
  absl::StrAppend(&sql, " ORDER BY ord DESC LIMIT ?3");
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(reader_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
    return DbError(reader_, "list evicted jobs");
  }
  sqlite3_bind_int64(stmt, 1, before_order);
  if (!tenant.empty()) BindText(stmt, 2, tenant);
  sqlite3_bind_int(stmt, 3, limit);
  return ReadRecords(reader_, stmt, "list evicted jobs");
}

absl::StatusOr<std::vector<v1::JobEvent>> SqliteStore::ReadEvents(const std::string& job_id,
                                                                  int64_t after_seq, int limit) {
  absl::MutexLock lock(&read_mu_);
  Reset reset(read_events_);
  BindText(read_events_, 1, job_id);
  sqlite3_bind_int64(read_events_, 2, after_seq);
  sqlite3_bind_int(read_events_, 3, limit);
  std::vector<v1::JobEvent> events;
  int rc;
  while ((rc = sqlite3_step(read_events_)) == SQLITE_ROW) {
    v1::JobEvent e;
    if (!ParseBlob(read_events_, 0, &e)) {
      return absl::DataLossError(absl::StrCat("store: an event of ", job_id, " does not parse"));
    }
    events.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return DbError(reader_, "read events");
  return events;
}

absl::StatusOr<std::vector<WorkerRecord>> SqliteStore::LoadWorkers() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT last_report_id, worker FROM workers ORDER BY id", -1, &stmt,
                         nullptr) != SQLITE_OK) {
    return Error("load workers");
  }
  std::vector<WorkerRecord> workers;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    WorkerRecord r;
    r.last_report_id = sqlite3_column_int64(stmt, 0);
    if (!ParseBlob(stmt, 1, &r.worker)) {
      sqlite3_finalize(stmt);
      return absl::DataLossError("store: a worker row does not parse");
    }
    workers.push_back(std::move(r));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return Error("load workers");
  return workers;
}

absl::Status SqliteStore::PutToken(const TokenRecord& record) {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  // Tokens change by hand, rarely: no statement kept prepared.
  if (sqlite3_prepare_v2(db_,
                         "INSERT OR REPLACE INTO tokens (id, created_ms, secret_sha256, token) "
                         "VALUES (?1, ?2, ?3, ?4)",
                         -1, &stmt, nullptr) != SQLITE_OK) {
    return Error("put token");
  }
  BindText(stmt, 1, record.token.id());
  sqlite3_bind_int64(stmt, 2, record.token.created_ms());
  BindBlob(stmt, 3, record.secret_sha256);
  BindBlob(stmt, 4, record.token.SerializeAsString());
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return Error("put token");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<TokenRecord>> SqliteStore::LoadTokens() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT secret_sha256, token FROM tokens ORDER BY created_ms, id", -1,
                         &stmt, nullptr) != SQLITE_OK) {
    return Error("load tokens");
  }
  std::vector<TokenRecord> tokens;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    TokenRecord r;
    r.secret_sha256.assign(static_cast<const char*>(sqlite3_column_blob(stmt, 0)),
                           static_cast<size_t>(sqlite3_column_bytes(stmt, 0)));
    if (!ParseBlob(stmt, 1, &r.token)) {
      sqlite3_finalize(stmt);
      return absl::DataLossError("store: a token row does not parse");
    }
    tokens.push_back(std::move(r));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return Error("load tokens");
  return tokens;
}

absl::StatusOr<LeaderLease> SqliteStore::Lead(const std::string& holder, const std::string& address,
                                              int64_t /*lease_ms*/) {
  absl::MutexLock lock(&lead_mu_);
  if (lead_fd_ < 0) {
    std::string path;
    {
      absl::MutexLock db_lock(&mu_);
      path = sqlite3_db_filename(db_, "main");
    }
    // A file of its own: every SqliteStore holds a shared flock on the
    // database file itself (HoldSharedLock).
    const std::string lock_path = path + ".coordinator-lock";
    const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::UnavailableError(
          absl::StrCat("store ", path, ": ", lock_path, ": ", std::strerror(errno)));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "store sqlite:", path,
          " is in use by another ballastd: SQLite serves one coordinator; run a second one on "
          "PostgreSQL (docs/control-plane.md, \"Two coordinators\")"));
    }
    lead_fd_ = fd;
  }
  return LeaderLease{1, holder, address, /*mine=*/true};
}

// The flock is the lease: it goes with the store.
absl::Status SqliteStore::Resign(const std::string& /*holder*/) { return absl::OkStatus(); }

}  // namespace ballast::server
