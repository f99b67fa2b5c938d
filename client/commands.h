// The `ballast` commands, one function each. A command prints its result to
// io.out, its errors to io.err as "ballast: MESSAGE", and returns the process
// exit code (see connection.h).
#ifndef BALLAST_CLIENT_COMMANDS_H_
#define BALLAST_CLIENT_COMMANDS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/connection.h"

namespace ballast::client {

enum class OutputFormat { kTable, kJson };

struct Io {
  std::ostream* out;
  std::ostream* err;
  // out is a terminal: `watch` draws a live progress line.
  bool tty = false;
  // Width of that terminal; 0 when unknown. The live line is cut to fit.
  int columns = 0;
};

// Retry and reconnect knobs; the defaults are the CLI's, tests shorten them.
struct Tuning {
  // SubmitJob tries on UNAVAILABLE, all with the same request id.
  int submit_attempts = 5;
  // Pause before the first retry; doubles after each.
  absl::Duration submit_backoff = absl::Milliseconds(250);
  // How long `watch` and `logs --follow` wait out a lost coordinator.
  absl::Duration reconnect_window = absl::Seconds(60);
};

// What every command runs with. `connection` must outlive the call.
struct Session {
  Connection* connection;
  OutputFormat format = OutputFormat::kTable;
  Io io;
  Tuning tuning;
};

struct SubmitArgs {
  std::string file;
  // `key.path=value` items, applied in order after the file.
  std::vector<std::string> overrides;
  // Watch the job after submitting it.
  bool wait = false;
  // Idempotency key; a random UUID v4 when empty.
  std::string request_id;
};

struct ListArgs {
  // State names as ParseState accepts them; empty lists all.
  std::vector<std::string> states;
  // Most jobs shown, newest first, 1..1000.
  int limit = 50;
};

// Loads the spec and its overrides locally (errors exit 2), submits it
// (retrying UNAVAILABLE with the same request id), prints
// "submitted JOB_ID" (JSON: the Job), then watches it when asked.
int Submit(Session& session, const SubmitArgs& args);

// Table (ID STATE NAME STEP LOSS AGE) or one ListJobsResponse JSON document,
// from ListJobs calls alone: each Job carries its last step's metrics.
int List(Session& session, const ListArgs& args);

// The job's details, or the Job as JSON. NOT_FOUND exits 1.
int Get(Session& session, const std::string& job_id);

// Follows the job to its terminal state, reconnecting after a broken stream
// for the reconnect window (then exits 3). Ends with FinalLine(); exits 0 on
// SUCCEEDED, 1 on FAILED or CANCELLED. JSON: one JobEvent per line.
int Watch(Session& session, const std::string& job_id);

// Prints "JOB_ID STATE" as CancelJob returned it (JSON: the Job).
int Cancel(Session& session, const std::string& job_id);

// Prints "JOB_ID STATE: ..." as RollbackJob returned it (JSON: the Job).
int Rollback(Session& session, const std::string& job_id, int64_t to_step);

// Table (ID HOST KIND BUSY/CAP ALIVE LAST HEARTBEAT) or one
// ListWorkersResponse JSON document.
int Workers(Session& session);

// Asks the coordinator's grpc.health.v1 service; prints its status
// (SERVING, NOT_SERVING...; JSON: the HealthCheckResponse). 0 when SERVING,
// 1 otherwise, 3 when unreachable: a probe for container health checks.
int Health(Session& session);

struct TokenCreateArgs {
  // "admin", "user" or "worker".
  std::string role;
  std::string tenant;
  std::string worker_id;
  std::string description;
};

// `token create`: prints the secret alone on stdout (it is shown this once),
// and what it is for on stderr; JSON: the CreateTokenResponse.
int TokenCreate(Session& session, const TokenCreateArgs& args);
// `token list`: ID ROLE TENANT/WORKER CREATED REVOKED DESCRIPTION.
int TokenList(Session& session);
// `token revoke ID`: the token stops working at once.
int TokenRevoke(Session& session, const std::string& id);

// Writes `path` (*.svg), the chart of the job's loss and grad_norm over the
// steps with its rollbacks and skipped steps marked (client/loss_chart.h),
// from the events the coordinator holds; prints the file and what it shows.
int Plot(Session& session, const std::string& job_id, const std::string& path);

// Prints the job's log lines (LogLineText; JSON: the JobEvents), up to the
// live edge (GetJob's last_seq), or on to the terminal state with `follow`.
int Logs(Session& session, const std::string& job_id, bool follow);

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_COMMANDS_H_
