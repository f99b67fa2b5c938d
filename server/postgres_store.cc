#include "server/postgres_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "server/store_rows.h"

namespace ballast::server {
namespace {

// Held through schema creation, so two ballastd opening an empty database
// at once do not both create it (CREATE ... IF NOT EXISTS races in
// PostgreSQL). Any constant; this one spells "ballast" in ASCII.
constexpr char kSchemaLock[] = "SELECT pg_advisory_xact_lock(27691666020332404)";

constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS ballast_schema (
  singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
  version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
  ord BIGINT PRIMARY KEY,
  id TEXT NOT NULL UNIQUE,
  request_id TEXT UNIQUE,
  state INTEGER NOT NULL,
  priority INTEGER NOT NULL,
  attempt INTEGER NOT NULL,
  resume_at_or_before BIGINT NOT NULL,
  events_deleted BIGINT NOT NULL,
  job BYTEA NOT NULL,
  tenant TEXT NOT NULL,
  evicted BOOLEAN NOT NULL);
CREATE INDEX IF NOT EXISTS evicted_jobs ON jobs(ord) WHERE evicted;
CREATE INDEX IF NOT EXISTS evicted_jobs_by_tenant ON jobs(tenant, ord) WHERE evicted;
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL,
  seq BIGINT NOT NULL,
  event BYTEA NOT NULL,
  PRIMARY KEY (job_id, seq));
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY,
  last_report_id BIGINT NOT NULL,
  worker BYTEA NOT NULL);
CREATE TABLE IF NOT EXISTS ballast_leader (
  singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
  epoch BIGINT NOT NULL,
  holder TEXT NOT NULL,
  address TEXT NOT NULL,
  expires_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
  id TEXT PRIMARY KEY,
  created_ms BIGINT NOT NULL,
  secret_sha256 BYTEA NOT NULL,
  token BYTEA NOT NULL);
)sql";

// A job's first write inserts it; later ones replace what changes (its
// submission order and request_id never do).
constexpr char kPutJob[] =
    "INSERT INTO jobs (ord, id, request_id, state, priority, attempt, resume_at_or_before, "
    "events_deleted, job, tenant, evicted) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) "
    "ON CONFLICT (id) DO UPDATE SET state = excluded.state, priority = excluded.priority, "
    "attempt = excluded.attempt, resume_at_or_before = excluded.resume_at_or_before, "
    "events_deleted = excluded.events_deleted, job = excluded.job, tenant = excluded.tenant, "
    "evicted = excluded.evicted";

// The lease: taken when there is none or it has expired (epoch + 1), renewed
// by its holder at its epoch ($4), else left alone (no row returned).
// Parameters: holder, address, lease in ms, the caller's epoch (0: none).
constexpr char kClaimLease[] =
    "INSERT INTO ballast_leader AS l (epoch, holder, address, expires_at) "
    "VALUES (1, $1, $2, now() + $3 * interval '1 millisecond') "
    "ON CONFLICT (singleton) DO UPDATE SET "
    "epoch = CASE WHEN l.holder = $1 AND l.epoch = $4 THEN l.epoch ELSE l.epoch + 1 END, "
    "holder = $1, address = $2, expires_at = excluded.expires_at "
    "WHERE (l.holder = $1 AND l.epoch = $4) OR l.expires_at < now() "
    "RETURNING epoch";

// The name a store's connections have in pg_stat_activity.
constexpr char kApplicationName[] = "ballastd";

// PostgreSQL's SQLSTATE for a unique constraint's violation.
constexpr std::string_view kUniqueViolation = "23505";

using Result = std::unique_ptr<PGresult, decltype(&PQclear)>;

// The parameters of one statement: text, or bytes sent as they are (BYTEA).
class Params {
 public:
  Params& Text(std::string value) { return Add(std::move(value), 0); }
  Params& Int(int64_t value) { return Add(absl::StrCat(value), 0); }
  Params& Bool(bool value) { return Add(value ? "true" : "false", 0); }
  Params& Bytes(std::string value) { return Add(std::move(value), 1); }
  Params& Null() {
    values_.emplace_back();
    formats_.push_back(0);
    null_.push_back(true);
    return *this;
  }

  int size() const { return static_cast<int>(values_.size()); }
  std::vector<const char*> values() const {
    std::vector<const char*> out;
    for (int i = 0; i < size(); ++i) out.push_back(null_[i] ? nullptr : values_[i].data());
    return out;
  }
  std::vector<int> lengths() const {
    std::vector<int> out;
    for (const std::string& v : values_) out.push_back(static_cast<int>(v.size()));
    return out;
  }
  const int* formats() const { return formats_.data(); }

 private:
  Params& Add(std::string value, int format) {
    values_.push_back(std::move(value));
    formats_.push_back(format);
    null_.push_back(false);
    return *this;
  }
  std::vector<std::string> values_;
  std::vector<int> formats_;
  std::vector<bool> null_;
};

// Results come in binary: integers big-endian in 2, 4 or 8 bytes, booleans
// in one, BYTEA and TEXT as they are.
std::string_view Bytes(const PGresult* r, int row, int column) {
  return std::string_view(PQgetvalue(r, row, column),
                          static_cast<size_t>(PQgetlength(r, row, column)));
}
int64_t Int(const PGresult* r, int row, int column) {
  const std::string_view bytes = Bytes(r, row, column);
  uint64_t value = 0;
  for (char c : bytes) value = (value << 8) | static_cast<uint8_t>(c);
  const size_t bits = 8 * bytes.size();
  if (bits > 0 && bits < 64 && (value >> (bits - 1)) != 0) value |= ~uint64_t{0} << bits;
  return static_cast<int64_t>(value);
}
bool Bool(const PGresult* r, int row, int column) {
  const std::string_view bytes = Bytes(r, row, column);
  return !bytes.empty() && bytes[0] != 0;
}

// libpq's message, without the newline it ends with.
absl::string_view Message(const char* text) { return absl::StripTrailingAsciiWhitespace(text); }

// The record of row `row` of a query of kRecordColumns.
absl::StatusOr<JobRecord> RecordFromRow(const PGresult* r, int row) {
  return DecodeJobRow(Int(r, row, 0), static_cast<int32_t>(Int(r, row, 1)), Int(r, row, 2),
                      Int(r, row, 3), Bool(r, row, 4), Bytes(r, row, 5));
}

absl::StatusOr<std::vector<JobRecord>> Records(const PGresult* r) {
  std::vector<JobRecord> jobs;
  for (int row = 0; row < PQntuples(r); ++row) {
    absl::StatusOr<JobRecord> record = RecordFromRow(r, row);
    if (!record.ok()) return record.status();
    jobs.push_back(*std::move(record));
  }
  return jobs;
}

}  // namespace

class PostgresStore::Connection {
 public:
  // UNAVAILABLE naming `url` without its password when it does not connect.
  // The server lists the connection under `application_name`
  // (pg_stat_activity), which CheckNotInUse looks for. `options`, when not
  // empty, is libpq's `options`: the session's settings (kept across a
  // reconnect).
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const std::string& url, const char* application_name = kApplicationName,
      const std::string& options = "") {
    // The URL's own settings come after ours (expand_dbname), so it may
    // change the timeout.
    const char* keys[] = {"connect_timeout", "application_name", "dbname",
                          options.empty() ? nullptr : "options", nullptr};
    const char* values[] = {"10", application_name, url.c_str(), options.c_str(), nullptr};
    PGconn* conn = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
    auto connection = std::unique_ptr<Connection>(new Connection(conn));
    if (PQstatus(conn) != CONNECTION_OK) {
      return absl::UnavailableError(
          absl::StrCat("store ", RedactStoreUrl(url), ": ", Message(PQerrorMessage(conn))));
    }
    return connection;
  }
  ~Connection() { PQfinish(conn_); }

  // Runs `sql` with `params`; `what` names it in errors. ALREADY_EXISTS when
  // it would break a unique constraint, UNAVAILABLE when it fails otherwise,
  // with the database's message.
  absl::StatusOr<Result> Run(const char* what, const std::string& sql,
                             const Params& params = Params()) {
    if (absl::Status s = Reconnect(what); !s.ok()) return s;
    const std::vector<const char*> values = params.values();
    const std::vector<int> lengths = params.lengths();
    Result r(PQexecParams(conn_, sql.c_str(), params.size(), nullptr, values.data(), lengths.data(),
                          params.formats(), /*resultFormat=*/1),
             &PQclear);
    const ExecStatusType status = PQresultStatus(r.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return ResultError(what, r.get());
    return r;
  }

  // One statement of RunPipelined; `what` names it in errors.
  struct Statement {
    const char* what;
    const char* sql;
    Params params;
  };

  // Runs `statements` in order, sending kPipelineDepth of them at a time
  // before reading their results (libpq's pipeline mode), so a batch of rows
  // costs a round trip per kPipelineDepth statements instead of one each.
  // Within a transaction: the first that fails aborts those after it, and
  // its error, as Run gives it, is returned with its index in `*failed`.
  absl::Status RunPipelined(absl::Span<const Statement> statements, size_t* failed) {
    for (size_t start = 0; start < statements.size(); start += kPipelineDepth) {
      const size_t n = std::min(kPipelineDepth, statements.size() - start);
      size_t index = 0;
      absl::Status s = RunPipeline(statements.subspan(start, n), &index);
      if (!s.ok()) {
        *failed = start + index;
        return s;
      }
    }
    return absl::OkStatus();
  }

  // Runs `sql`, statements without parameters, in one go.
  absl::Status Exec(const char* what, const char* sql) {
    if (absl::Status s = Reconnect(what); !s.ok()) return s;
    Result r(PQexec(conn_, sql), &PQclear);
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK && PQresultStatus(r.get()) != PGRES_TUPLES_OK) {
      return absl::UnavailableError(
          absl::StrCat("store: ", what, ": ", Message(PQresultErrorMessage(r.get()))));
    }
    return absl::OkStatus();
  }

  // Runs `body` between BEGIN and COMMIT, and rolls back when it fails.
  template <typename Body>
  absl::Status Transaction(Body body) {
    if (absl::Status s = Exec("begin", "BEGIN"); !s.ok()) return s;
    in_transaction_ = true;
    absl::Status s = body();
    if (s.ok()) s = Exec("commit", "COMMIT");
    in_transaction_ = false;
    if (!s.ok()) (void)Exec("rollback", "ROLLBACK");
    return s;
  }

 private:
  explicit Connection(PGconn* conn) : conn_(conn) {}

  // Statements sent before their results are read. Their results (a few
  // bytes each) never fill the server's socket buffer, which would stall
  // it while this side still sends.
  static constexpr size_t kPipelineDepth = 256;

  // The error of a statement's result, as Run gives it.
  static absl::Status ResultError(const char* what, const PGresult* r) {
    std::string message = absl::StrCat("store: ", what, ": ", Message(PQresultErrorMessage(r)));
    const char* state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    if (state != nullptr && state == kUniqueViolation) return absl::AlreadyExistsError(message);
    return absl::UnavailableError(message);
  }

  // One pipeline: every statement sent, a sync, then every result read up
  // to the sync's, so the connection leaves pipeline mode idle whatever
  // failed. The first error, with its statement's index in `*failed`.
  absl::Status RunPipeline(absl::Span<const Statement> statements, size_t* failed) {
    if (absl::Status s = Reconnect(statements.front().what); !s.ok()) return s;
    auto lost = [&](const char* what) {
      return absl::UnavailableError(
          absl::StrCat("store: ", what, ": ", Message(PQerrorMessage(conn_))));
    };
    if (PQenterPipelineMode(conn_) != 1) return lost("enter pipeline mode");
    absl::Status first = absl::OkStatus();
    size_t sent = 0;
    for (const Statement& st : statements) {
      const std::vector<const char*> values = st.params.values();
      const std::vector<int> lengths = st.params.lengths();
      if (PQsendQueryParams(conn_, st.sql, st.params.size(), nullptr, values.data(), lengths.data(),
                            st.params.formats(), /*resultFormat=*/1) != 1) {
        first = lost(st.what);
        *failed = sent;
        break;
      }
      ++sent;
    }
    if (PQpipelineSync(conn_) != 1) {
      if (first.ok()) *failed = sent;
      first.Update(lost("pipeline sync"));
    }
    // Each statement's results end with a NULL; the sync's result ends it
    // all. A broken connection ends it too (PQgetResult gives NULLs).
    size_t index = 0;
    int nulls_in_a_row = 0;
    while (nulls_in_a_row < 2) {
      Result r(PQgetResult(conn_), &PQclear);
      if (r == nullptr) {
        ++index;
        ++nulls_in_a_row;
        continue;
      }
      nulls_in_a_row = 0;
      const ExecStatusType status = PQresultStatus(r.get());
      if (status == PGRES_PIPELINE_SYNC) break;
      if (status == PGRES_FATAL_ERROR && first.ok()) {
        first = ResultError(index < sent ? statements[index].what : "pipeline", r.get());
        *failed = index;
      }
    }
    if (PQexitPipelineMode(conn_) != 1 && first.ok()) first = lost("leave pipeline mode");
    return first;
  }

  // A connection the server closed (it restarted) is opened again; the call
  // that found it closed has already failed. Not within a transaction:
  // what came after would be committed apart from what came before.
  // PQreset also ends a pipeline the closed connection left open (libpq's
  // closePGconn sets its pipeline status off), so RunPipeline's enter
  // finds the connection out of pipeline mode.
  absl::Status Reconnect(const char* what) {
    if (PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
    if (in_transaction_) {
      return absl::UnavailableError(
          absl::StrCat("store: ", what, ": the connection was lost within a transaction"));
    }
    PQreset(conn_);
    if (PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
    return absl::UnavailableError(
        absl::StrCat("store: ", what, ": ", Message(PQerrorMessage(conn_))));
  }

  PGconn* const conn_;
  // Between BEGIN and its COMMIT or ROLLBACK.
  bool in_transaction_ = false;
};

absl::StatusOr<std::unique_ptr<Store>> PostgresStore::Open(const std::string& url) {
  absl::StatusOr<std::unique_ptr<Connection>> writer = Connection::Open(url);
  if (!writer.ok()) return writer.status();
  const std::string where = absl::StrCat("store ", RedactStoreUrl(url));
  absl::Status made = (*writer)->Transaction([&]() -> absl::Status {
    if (absl::Status s = (*writer)->Exec("lock the schema", kSchemaLock); !s.ok()) return s;
    if (absl::Status s = (*writer)->Exec("create the schema", kSchema); !s.ok()) return s;
    absl::StatusOr<Result> version =
        (*writer)->Run("schema version",
                       absl::StrCat("INSERT INTO ballast_schema (version) VALUES (", kSchemaVersion,
                                    ") ON CONFLICT (singleton) DO UPDATE SET version = "
                                    "ballast_schema.version RETURNING version"));
    if (!version.ok()) return version.status();
    return CheckSchemaVersion(where, Int(version->get(), 0, 0));
  });
  if (!made.ok()) {
    if (made.code() == absl::StatusCode::kFailedPrecondition) return made;
    return absl::UnavailableError(
        absl::StrCat(where, ": ", absl::StripPrefix(made.message(), "store: ")));
  }
  absl::StatusOr<std::unique_ptr<Connection>> reader = Connection::Open(url);
  if (!reader.ok()) return reader.status();
  return std::unique_ptr<Store>(new PostgresStore(url, *std::move(writer), *std::move(reader)));
}

PostgresStore::PostgresStore(std::string url, std::unique_ptr<Connection> writer,
                             std::unique_ptr<Connection> reader)
    : writer_(std::move(writer)), reader_(std::move(reader)), url_(std::move(url)) {}

absl::StatusOr<LeaderLease> PostgresStore::Lead(const std::string& holder,
                                                const std::string& address, int64_t lease_ms) {
  absl::MutexLock lock(&lead_mu_);
  if (leader_ == nullptr) {
    // Each statement here is a transaction of its own, and none may wait or
    // idle for longer than a lease: a takeover's waits for the writes under
    // way (they hold the row FOR SHARE) but not for ever, and a leader frozen
    // within a statement holds no takeover back.
    absl::StatusOr<std::unique_ptr<Connection>> opened = Connection::Open(
        url_, kApplicationName,
        absl::StrCat("-c lock_timeout=", lease_ms, " -c statement_timeout=", lease_ms,
                     " -c idle_in_transaction_session_timeout=", lease_ms));
    if (!opened.ok()) return opened.status();
    leader_ = *std::move(opened);
  }
  lease_ms_ = lease_ms;
  fenced_ = true;
  LeaderLease lease;
  absl::StatusOr<Result> r =
      leader_->Run("claim the lease", kClaimLease,
                   Params().Text(holder).Text(address).Int(lease_ms).Int(epoch_));
  if (!r.ok()) return r.status();
  if (PQntuples(r->get()) == 1) {
    lease = LeaderLease{Int(r->get(), 0, 0), holder, address, /*mine=*/true};
  } else {
    r = leader_->Run("read the lease", "SELECT epoch, holder, address FROM ballast_leader");
    if (!r.ok()) return r.status();
    lease = LeaderLease{Int(r->get(), 0, 0), std::string(Bytes(r->get(), 0, 1)),
                        std::string(Bytes(r->get(), 0, 2)), /*mine=*/false};
  }
  // A store that lost the lease stays fenced at its old epoch until it
  // takes the lease again.
  if (lease.mine) epoch_ = lease.epoch;
  return lease;
}

absl::Status PostgresStore::Resign(const std::string& holder) {
  absl::MutexLock lock(&lead_mu_);
  const int64_t mine = epoch_.exchange(0);
  if (leader_ == nullptr || mine == 0) return absl::OkStatus();
  return leader_
      ->Run("resign the lease",
            "UPDATE ballast_leader SET expires_at = now() - interval '1 millisecond' "
            "WHERE holder = $1 AND epoch = $2",
            Params().Text(holder).Int(mine))
      .status();
}

absl::Status PostgresStore::FenceWrites() {
  if (!fenced_) return absl::OkStatus();
  // The transaction may idle no longer than a lease: were this process
  // frozen mid-write, its row lock would hold a takeover back until then.
  absl::StatusOr<Result> r = writer_->Run(
      "check the epoch",
      "SELECT epoch, address, set_config('idle_in_transaction_session_timeout', $1, true) "
      "FROM ballast_leader FOR SHARE",
      Params().Text(absl::StrCat(lease_ms_.load(), "ms")));
  if (!r.ok()) return r.status();
  const int64_t mine = epoch_;
  if (PQntuples(r->get()) == 1 && Int(r->get(), 0, 0) == mine) return absl::OkStatus();
  if (PQntuples(r->get()) == 0) {
    return absl::AbortedError("deposed: no coordinator holds the lease; this one never led");
  }
  const std::string leader =
      absl::StrCat(std::string(Bytes(r->get(), 0, 1)), " at epoch ", Int(r->get(), 0, 0));
  if (mine == 0) {
    return absl::AbortedError(
        absl::StrCat("standby: the leader is ", leader, "; the write is refused"));
  }
  return absl::AbortedError(absl::StrCat("deposed: this coordinator led at epoch ", mine,
                                         "; the leader is now ", leader, "; the write is refused"));
}

PostgresStore::~PostgresStore() = default;

absl::Status PostgresStore::Ping() {
  absl::MutexLock lock(&mu_);
  return writer_->Run("ping", "SELECT 1").status();
}

namespace {

// The statements that write `change` onto `out`, in order: its new events,
// its trim, and last its row.
void AppendJob(const StoreBatch::JobChange& change, int64_t retention,
               std::vector<PostgresStore::Connection::Statement>* out) {
  const JobRow row = EncodeJobRow(change, retention);
  for (const v1::JobEvent& e : change.events) {
    out->push_back({"insert event",
                    "INSERT INTO events (job_id, seq, event) VALUES ($1, $2, $3) "
                    "ON CONFLICT (job_id, seq) DO UPDATE SET event = excluded.event",
                    Params().Text(e.job_id()).Int(e.seq()).Bytes(e.SerializeAsString())});
  }
  if (row.trim_events_through > 0) {
    out->push_back({"trim events", "DELETE FROM events WHERE job_id = $1 AND seq <= $2",
                    Params().Text(row.id).Int(row.trim_events_through)});
  }
  Params params;
  params.Int(row.order).Text(row.id);
  if (row.request_id) {
    params.Text(*row.request_id);
  } else {
    params.Null();
  }
  params.Int(row.state)
      .Int(row.priority)
      .Int(row.attempt)
      .Int(row.resume_at_or_before)
      .Int(row.events_deleted)
      .Bytes(row.job)
      .Text(row.tenant)
      .Bool(row.evicted);
  out->push_back({"write job", kPutJob, std::move(params)});
}

}  // namespace

absl::Status PostgresStore::Write(absl::Span<const StoreBatch* const> batches, int64_t retention) {
  absl::MutexLock lock(&mu_);
  return writer_->Transaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (absl::Status s = FenceWrites(); !s.ok()) return s;
    // Every row of every batch, sent in one pipeline: a round trip per
    // Connection::kPipelineDepth rows rather than per row. `jobs[i]` is the
    // job whose row statement i writes, for the error of a taken request_id.
    std::vector<Connection::Statement> statements;
    std::vector<const v1::Job*> jobs;
    for (const StoreBatch* batch : batches) {
      for (const StoreBatch::JobChange& change : batch->jobs) {
        AppendJob(change, retention, &statements);
        jobs.resize(statements.size(), nullptr);
        jobs.back() = &change.record.job;
      }
      for (const WorkerRecord& w : batch->workers) {
        statements.push_back(
            {"put worker",
             "INSERT INTO workers (id, last_report_id, worker) VALUES ($1, $2, $3) ON CONFLICT "
             "(id) DO UPDATE SET last_report_id = excluded.last_report_id, worker = "
             "excluded.worker",
             Params()
                 .Text(w.worker.id())
                 .Int(w.last_report_id)
                 .Bytes(w.worker.SerializeAsString())});
      }
    }
    if (statements.empty()) return absl::OkStatus();
    jobs.resize(statements.size(), nullptr);
    size_t failed = 0;
    absl::Status s = writer_->RunPipelined(statements, &failed);
    // Only request_id's constraint (PostgreSQL names a column's UNIQUE
    // TABLE_COLUMN_key) is the client's doing; a clash of ord, the store's
    // own key, is a fault of ballastd and keeps PostgreSQL's message.
    if (s.code() == absl::StatusCode::kAlreadyExists && jobs[failed] != nullptr &&
        absl::StrContains(s.message(), "jobs_request_id_key")) {
      return RequestIdTaken(*jobs[failed]);
    }
    return s;
  });
}

absl::StatusOr<std::vector<JobRecord>> PostgresStore::LoadJobs() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Result> r = writer_->Run(
      "load jobs",
      absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE NOT evicted ORDER BY ord"));
  if (!r.ok()) return r.status();
  return Records(r->get());
}

absl::StatusOr<int64_t> PostgresStore::LastJobOrder() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Result> r =
      writer_->Run("last job order", "SELECT COALESCE(MAX(ord), 0)::BIGINT FROM jobs");
  if (!r.ok()) return r.status();
  return Int(r->get(), 0, 0);
}

absl::StatusOr<std::map<int, int64_t>> PostgresStore::CountEvictedJobs() {
  absl::MutexLock lock(&read_mu_);
  absl::StatusOr<Result> r = reader_->Run(
      "count evicted jobs", "SELECT state, COUNT(*) FROM jobs WHERE evicted GROUP BY state");
  if (!r.ok()) return r.status();
  std::map<int, int64_t> counts;
  for (int row = 0; row < PQntuples(r->get()); ++row) {
    counts[static_cast<int>(Int(r->get(), row, 0))] = Int(r->get(), row, 1);
  }
  return counts;
}

absl::StatusOr<std::map<int, int64_t>> PostgresStore::PruneEvictedJobs(int64_t keep,
                                                                       int64_t limit) {
  absl::MutexLock lock(&mu_);
  // The oldest `limit` evicted jobs older than the newest `keep` ones, their
  // events, then the jobs, in one statement after the fence.
  std::map<int, int64_t> pruned;
  absl::Status done =
      writer_->Transaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
        if (absl::Status s = FenceWrites(); !s.ok()) return s;
        absl::StatusOr<Result> r = writer_->Run(
            "prune jobs",
            "WITH victims AS (SELECT id FROM jobs WHERE evicted AND ord <= "
            "(SELECT ord FROM jobs WHERE evicted ORDER BY ord DESC LIMIT 1 OFFSET $1) "
            "ORDER BY ord LIMIT $2), "
            "gone_events AS (DELETE FROM events WHERE job_id IN (SELECT id FROM victims)) "
            "DELETE FROM jobs WHERE id IN (SELECT id FROM victims) RETURNING state",
            Params().Int(keep).Int(limit));
        if (!r.ok()) return r.status();
        for (int row = 0; row < PQntuples(r->get()); ++row)
          ++pruned[static_cast<int>(Int(r->get(), row, 0))];
        return absl::OkStatus();
      });
  if (!done.ok()) return done;
  return pruned;
}

absl::StatusOr<std::optional<JobRecord>> PostgresStore::ReadJob(const std::string& job_id) {
  absl::MutexLock lock(&read_mu_);
  absl::StatusOr<Result> r =
      reader_->Run("read job", absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE id = $1"),
                   Params().Text(job_id));
  if (!r.ok()) return r.status();
  if (PQntuples(r->get()) == 0) return std::nullopt;
  absl::StatusOr<JobRecord> record = RecordFromRow(r->get(), 0);
  if (!record.ok()) return record.status();
  return std::optional<JobRecord>(*std::move(record));
}

absl::StatusOr<std::optional<std::string>> PostgresStore::JobOfRequest(
    const std::string& scoped_request_id) {
  absl::MutexLock lock(&read_mu_);
  absl::StatusOr<Result> r =
      reader_->Run("find request_id", "SELECT id FROM jobs WHERE request_id = $1",
                   Params().Text(scoped_request_id));
  if (!r.ok()) return r.status();
  if (PQntuples(r->get()) == 0) return std::nullopt;
  return std::optional<std::string>(Bytes(r->get(), 0, 0));
}

absl::StatusOr<std::vector<JobRecord>> PostgresStore::ListEvictedJobs(int64_t before_order,
                                                                      const std::set<int>& states,
                                                                      const std::string& tenant,
                                                                      int limit) {
  absl::MutexLock lock(&read_mu_);
  Params params;
  params.Int(before_order).Int(limit);
  std::string sql =
      absl::StrCat("SELECT ", kRecordColumns, " FROM jobs WHERE evicted AND ord < $1");
  if (!tenant.empty()) {
    absl::StrAppend(&sql, " AND tenant = $3");
    params.Text(tenant);
  }
  if (!states.empty()) absl::StrAppend(&sql, " AND state IN (", absl::StrJoin(states, ", "), ")");
  absl::StrAppend(&sql, " ORDER BY ord DESC LIMIT $2");
  absl::StatusOr<Result> r = reader_->Run("list evicted jobs", sql, params);
  if (!r.ok()) return r.status();
  return Records(r->get());
}

absl::StatusOr<std::vector<v1::JobEvent>> PostgresStore::ReadEvents(const std::string& job_id,
                                                                    int64_t after_seq, int limit) {
  absl::MutexLock lock(&read_mu_);
  absl::StatusOr<Result> r =
      reader_->Run("read events",
                   "SELECT event FROM events WHERE job_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                   Params().Text(job_id).Int(after_seq).Int(limit));
  if (!r.ok()) return r.status();
  std::vector<v1::JobEvent> events(PQntuples(r->get()));
  for (int row = 0; row < PQntuples(r->get()); ++row) {
    const std::string_view bytes = Bytes(r->get(), row, 0);
    if (!events[row].ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError(absl::StrCat("store: an event of ", job_id, " does not parse"));
    }
  }
  return events;
}

absl::StatusOr<std::vector<WorkerRecord>> PostgresStore::LoadWorkers() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Result> r =
      writer_->Run("load workers", "SELECT last_report_id, worker FROM workers ORDER BY id");
  if (!r.ok()) return r.status();
  std::vector<WorkerRecord> workers(PQntuples(r->get()));
  for (int row = 0; row < PQntuples(r->get()); ++row) {
    workers[row].last_report_id = Int(r->get(), row, 0);
    const std::string_view bytes = Bytes(r->get(), row, 1);
    if (!workers[row].worker.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError("store: a worker row does not parse");
    }
  }
  return workers;
}

absl::Status PostgresStore::PutToken(const TokenRecord& record) {
  absl::MutexLock lock(&mu_);
  return writer_->Transaction([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (absl::Status s = FenceWrites(); !s.ok()) return s;
    return writer_
        ->Run("put token",
              "INSERT INTO tokens (id, created_ms, secret_sha256, token) VALUES ($1, $2, $3, $4) "
              "ON CONFLICT (id) DO UPDATE SET created_ms = excluded.created_ms, "
              "secret_sha256 = excluded.secret_sha256, token = excluded.token",
              Params()
                  .Text(record.token.id())
                  .Int(record.token.created_ms())
                  .Bytes(record.secret_sha256)
                  .Bytes(record.token.SerializeAsString()))
        .status();
  });
}

absl::StatusOr<std::vector<TokenRecord>> PostgresStore::LoadTokens() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<Result> r = writer_->Run(
      "load tokens", "SELECT secret_sha256, token FROM tokens ORDER BY created_ms, id");
  if (!r.ok()) return r.status();
  std::vector<TokenRecord> tokens(PQntuples(r->get()));
  for (int row = 0; row < PQntuples(r->get()); ++row) {
    tokens[row].secret_sha256 = std::string(Bytes(r->get(), row, 0));
    const std::string_view bytes = Bytes(r->get(), row, 1);
    if (!tokens[row].token.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return absl::DataLossError("store: a token row does not parse");
    }
  }
  return tokens;
}

absl::Status PostgresStore::CheckNotInUse(const std::string& url) {
  absl::StatusOr<std::unique_ptr<Connection>> connection =
      Connection::Open(url, "ballastd migrate-store");
  if (!connection.ok()) return connection.status();
  // A server process outlives its client's goodbye for a moment: a ballastd
  // that has just stopped may still be listed, for a second at the most.
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  absl::StatusOr<Result> r;
  int64_t connections = 0;
  do {
    if (connections > 0) absl::SleepFor(absl::Milliseconds(100));
    r = (*connection)
            ->Run(
                "connections of ballastd",
                // client_addr is NULL for a unix socket, and for another role's
                // connection (application_name is visible to every role).
                "SELECT COUNT(*)::BIGINT, COALESCE(STRING_AGG(DISTINCT COALESCE(HOST(client_addr), "
                "'local'), ', '), '') FROM pg_stat_activity WHERE datname = current_database() AND "
                "application_name = $1",
                Params().Text(kApplicationName));
    if (!r.ok()) return r.status();
    connections = Int(r->get(), 0, 0);
  } while (connections > 0 && absl::Now() < deadline);
  if (connections == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("store ", RedactStoreUrl(url), " is open in ", connections,
                   " connection(s) of ballastd (from ", std::string(Bytes(r->get(), 0, 1)),
                   "): a running ballastd? stop it first"));
}

}  // namespace ballast::server
