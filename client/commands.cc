#include "client/commands.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/event_stream.h"
#include "client/job_format.h"
#include "client/loss_chart.h"
#include "client/request_id.h"
#include "client/watch_view.h"
#include "common/job_spec.h"
#include "common/job_spec_paths.h"

namespace ballast::client {

namespace {

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

// Prints the error and returns its exit code. The message may quote what
// other users wrote (a job name, a reason), so it is printed escaped.
int Fail(Session& session, const absl::Status& status) {
  std::ostream& err = *session.io.err;
  const Connection& c = *session.connection;
  if (status.code() == absl::StatusCode::kCancelled && c.interrupt()->triggered()) {
    err << "ballast: interrupted\n";
    return kExitInterrupted;
  }
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      err << "ballast: cannot reach the coordinator at " << c.options().address << ": "
          << Printable(status.message()) << "\n";
      break;
    case absl::StatusCode::kUnauthenticated:
      err << "ballast: " << Printable(status.message())
          << " (the token comes from BALLAST_TOKEN)\n";
      break;
    default:
      err << "ballast: " << Printable(status.message()) << "\n";
  }
  return ExitCodeFor(status.code());
}

void PrintJson(Session& session, const google::protobuf::Message& message) {
  *session.io.out << ToJson(message) << "\n" << std::flush;
}

absl::StatusOr<v1::Job> SubmitWithRetries(Session& session, const v1::SubmitJobRequest& request) {
  Connection& c = *session.connection;
  absl::Duration pause = session.tuning.submit_backoff;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<v1::Job> job = c.Unary(&v1::JobService::Stub::SubmitJob, request);
    // Retrying is safe only because the request id makes SubmitJob idempotent.
    if (job.ok() || job.status().code() != absl::StatusCode::kUnavailable ||
        attempt >= session.tuning.submit_attempts) {
      return job;
    }
    *session.io.err << "ballast: coordinator unavailable (" << job.status().message()
                    << "); retrying (" << attempt + 1 << "/" << session.tuning.submit_attempts
                    << ")\n";
    if (!c.interrupt()->SleepFor(pause)) return absl::CancelledError("interrupted");
    pause *= 2;
  }
}

}  // namespace

int Submit(Session& session, const SubmitArgs& args) {
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(args.file);
  if (!spec.ok()) {
    const absl::string_view message = spec.status().message();
    *session.io.err << "ballast: "
                    << (absl::StrContains(message, args.file) ? "" : args.file + ": ") << message
                    << "\n";
    return kExitUsage;
  }
  if (absl::Status s = ApplyOverrides(args.overrides, &*spec); !s.ok()) {
    *session.io.err << "ballast: --set: " << s.message() << "\n";
    return kExitUsage;
  }
  // The user means the folder they typed in; ballastd would read its own.
  if (absl::Status s = MakeSpecPathsAbsolute(&*spec); !s.ok()) {
    *session.io.err << "ballast: " << s.message() << "\n";
    return kExitUsage;
  }
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *std::move(spec);
  request.set_request_id(args.request_id.empty() ? NewRequestId() : args.request_id);
  absl::StatusOr<v1::Job> job = SubmitWithRetries(session, request);
  if (!job.ok()) return Fail(session, job.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *job);
  } else {
    *session.io.out << "submitted " << Printable(job->id()) << "\n" << std::flush;
  }
  return args.wait ? Watch(session, job->id()) : kExitOk;
}

int List(Session& session, const ListArgs& args) {
  Connection& c = *session.connection;
  v1::ListJobsRequest request;
  for (const std::string& name : args.states) {
    absl::StatusOr<v1::JobState> state = ParseState(name);
    if (!state.ok()) return Fail(session, state.status());
    request.add_states(*state);
  }
  v1::ListJobsResponse all;
  do {
    request.set_page_size(args.limit - all.jobs_size());
    absl::StatusOr<v1::ListJobsResponse> page = c.Unary(&v1::JobService::Stub::ListJobs, request);
    if (!page.ok()) return Fail(session, page.status());
    for (v1::Job& job : *page->mutable_jobs()) {
      if (all.jobs_size() < args.limit) *all.add_jobs() = std::move(job);
    }
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty() && all.jobs_size() < args.limit);

  if (session.format == OutputFormat::kJson) {
    PrintJson(session, all);
    return kExitOk;
  }
  std::vector<v1::Job> jobs(all.jobs().begin(), all.jobs().end());
  *session.io.out << JobTable(jobs, NowMs()) << std::flush;
  return kExitOk;
}

int Get(Session& session, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = session.connection->GetJob(job_id);
  if (!job.ok()) return Fail(session, job.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *job);
  } else {
    *session.io.out << JobDetail(*job, NowMs()) << std::flush;
  }
  return kExitOk;
}

int Watch(Session& session, const std::string& job_id) {
  Connection& c = *session.connection;
  // Learn about a wrong id or an unreachable coordinator before streaming.
  absl::StatusOr<v1::Job> job = c.GetJob(job_id);
  if (!job.ok()) return Fail(session, job.status());

  const bool json = session.format == OutputFormat::kJson;
  WatchView view(session.io.out, session.io.err, session.io.tty, session.io.columns);
  std::string last_reason;
  FollowOptions options{.job_id = job_id, .reconnect_window = session.tuning.reconnect_window};
  absl::StatusOr<v1::JobState> end = FollowEvents(
      c, options,
      [&](const v1::JobEvent& event) {
        if (event.has_state_change()) last_reason = event.state_change().reason();
        if (json) {
          PrintJson(session, event);
        } else {
          view.OnEvent(event);
        }
      },
      [&](const std::string& notice) { view.Notice(notice); });
  view.Finish();
  if (!end.ok()) {
    const int code = Fail(session, end.status());
    if (code == kExitInterrupted) {
      *session.io.err << "ballast: " << job_id << " keeps running; `ballast cancel " << job_id
                      << "` stops it\n";
    }
    return code;
  }
  // The failure reason lives on the Job; the last state change is the fallback.
  absl::StatusOr<v1::Job> final_job = c.GetJob(job_id);
  if (!final_job.ok() || !IsTerminal(final_job->state())) {
    final_job = v1::Job();
    final_job->set_id(job_id);
    final_job->set_state(*end);
    final_job->set_failure_reason(last_reason);
  }
  if (!json) *session.io.out << FinalLine(*final_job) << "\n" << std::flush;
  return *end == v1::JOB_STATE_SUCCEEDED ? kExitOk : kExitJobFailed;
}

int Cancel(Session& session, const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  absl::StatusOr<v1::Job> job =
      session.connection->Unary(&v1::JobService::Stub::CancelJob, request);
  if (!job.ok()) return Fail(session, job.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *job);
  } else {
    *session.io.out << Printable(job->id()) << " " << StateName(job->state()) << "\n" << std::flush;
  }
  return kExitOk;
}

int Rollback(Session& session, const std::string& job_id, int64_t to_step) {
  v1::RollbackJobRequest request;
  request.set_job_id(job_id);
  request.set_to_step(to_step);
  absl::StatusOr<v1::Job> job =
      session.connection->Unary(&v1::JobService::Stub::RollbackJob, request);
  if (!job.ok()) return Fail(session, job.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *job);
  } else {
    *session.io.out << Printable(job->id()) << " " << StateName(job->state())
                    << ": restarting from the newest checkpoint at or before step " << to_step
                    << "\n"
                    << std::flush;
  }
  return kExitOk;
}

int Workers(Session& session) {
  absl::StatusOr<v1::ListWorkersResponse> workers =
      session.connection->Unary(&v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest());
  if (!workers.ok()) return Fail(session, workers.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *workers);
  } else {
    std::vector<v1::Worker> list(workers->workers().begin(), workers->workers().end());
    *session.io.out << WorkerTable(list, NowMs()) << std::flush;
  }
  return kExitOk;
}

int Health(Session& session) {
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> health = session.connection->CheckHealth();
  if (!health.ok()) return Fail(session, health.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *health);
  } else {
    *session.io.out << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(health->status())
                    << "\n"
                    << std::flush;
  }
  return health->status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                            : kExitJobFailed;
}

int TokenCreate(Session& session, const TokenCreateArgs& args) {
  v1::CreateTokenRequest request;
  v1::Role role = v1::ROLE_UNSPECIFIED;
  if (!v1::Role_Parse(absl::StrCat("ROLE_", absl::AsciiStrToUpper(args.role)), &role) ||
      role == v1::ROLE_UNSPECIFIED) {
    return Fail(session, absl::InvalidArgumentError(
                             absl::StrCat("--role ", args.role, ": one of admin, user or worker")));
  }
  request.set_role(role);
  request.set_tenant(args.tenant);
  request.set_worker_id(args.worker_id);
  request.set_description(args.description);
  absl::StatusOr<v1::CreateTokenResponse> created =
      session.connection->Unary(&v1::TokenService::Stub::CreateToken, request);
  if (!created.ok()) return Fail(session, created.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *created);
    return kExitOk;
  }
  const v1::Token& t = created->token();
  *session.io.err << "ballast: token " << t.id() << " (" << RoleName(t.role())
                  << (t.role() == v1::ROLE_WORKER ? " of worker " + t.worker_id()
                                                  : " of tenant " + t.tenant())
                  << "); its secret is shown only now, as BALLAST_TOKEN:\n";
  *session.io.out << created->secret() << "\n" << std::flush;
  return kExitOk;
}

int TokenList(Session& session) {
  absl::StatusOr<v1::ListTokensResponse> tokens =
      session.connection->Unary(&v1::TokenService::Stub::ListTokens, v1::ListTokensRequest());
  if (!tokens.ok()) return Fail(session, tokens.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *tokens);
    return kExitOk;
  }
  std::vector<v1::Token> list(tokens->tokens().begin(), tokens->tokens().end());
  *session.io.out << TokenTable(list, NowMs()) << std::flush;
  return kExitOk;
}

int TokenRevoke(Session& session, const std::string& id) {
  v1::RevokeTokenRequest request;
  request.set_id(id);
  absl::StatusOr<v1::Token> token =
      session.connection->Unary(&v1::TokenService::Stub::RevokeToken, request);
  if (!token.ok()) return Fail(session, token.status());
  if (session.format == OutputFormat::kJson) {
    PrintJson(session, *token);
  } else {
    *session.io.out << "revoked " << token->id() << "\n" << std::flush;
  }
  return kExitOk;
}

int Logs(Session& session, const std::string& job_id, bool follow) {
  Connection& c = *session.connection;
  absl::StatusOr<v1::Job> job = c.GetJob(job_id);
  if (!job.ok()) return Fail(session, job.status());
  if (!follow && job->last_seq() == 0) return kExitOk;
  FollowOptions options{.job_id = job_id,
                        .stop_at_seq = follow ? 0 : job->last_seq(),
                        .reconnect_window = session.tuning.reconnect_window};
  absl::StatusOr<v1::JobState> end = FollowEvents(
      c, options,
      [&](const v1::JobEvent& event) {
        if (!event.training().has_log()) return;
        if (session.format == OutputFormat::kJson) {
          PrintJson(session, event);
        } else {
          *session.io.out << LogLineText(event.training().log()) << "\n" << std::flush;
        }
      },
      [&](const std::string& notice) { *session.io.err << "ballast: " << notice << "\n"; });
  if (!end.ok()) return Fail(session, end.status());
  return kExitOk;
}

int Plot(Session& session, const std::string& job_id, const std::string& path) {
  if (!absl::EndsWith(path, ".svg")) {
    *session.io.err << "ballast: plot writes SVG; name the file *.svg, got " << path
                    << " (rsvg-convert or a browser turns it into a PNG)\n";
    return kExitUsage;
  }
  Connection& c = *session.connection;
  absl::StatusOr<v1::Job> job = c.GetJob(job_id);
  if (!job.ok()) return Fail(session, job.status());
  LossChart chart(absl::StrCat(job_id, job->spec().name().empty() ? "" : " ", job->spec().name(),
                               ": loss and grad_norm"));
  int64_t first_seq = 0;
  if (job->last_seq() > 0) {
    FollowOptions options{.job_id = job_id,
                          .stop_at_seq = job->last_seq(),
                          .reconnect_window = session.tuning.reconnect_window};
    absl::StatusOr<v1::JobState> end = FollowEvents(
        c, options,
        [&](const v1::JobEvent& event) {
          if (first_seq == 0) first_seq = event.seq();
          chart.Add(event);
        },
        [&](const std::string& notice) { *session.io.err << "ballast: " << notice << "\n"; });
    if (!end.ok()) return Fail(session, end.status());
  }
  // Written beside the target and renamed, so a reader never sees half a file.
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << chart.Svg();
    out.close();
    if (!out) {
      *session.io.err << "ballast: cannot write " << partial << ": " << std::strerror(errno)
                      << "\n";
      std::remove(partial.c_str());
      return kExitJobFailed;
    }
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    *session.io.err << "ballast: cannot write " << path << ": " << std::strerror(errno) << "\n";
    std::remove(partial.c_str());
    return kExitJobFailed;
  }
  *session.io.out << "wrote " << path << ": " << chart.steps() << " steps, " << chart.rollbacks()
                  << " rollbacks\n";
  if (first_seq > 1) {
    *session.io.err << "ballast: the coordinator kept events from seq " << first_seq
                    << " on (--event-retention); the job's metrics.jsonl has every step\n";
  }
  return kExitOk;
}

}  // namespace ballast::client
