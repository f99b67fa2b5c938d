#include "client/cli.h"

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "client/migrate_store.h"
#include "common/tls.h"
#include "common/version.h"

namespace ballast::client {

int RunCli(int argc, const char* const* argv, const Io& io, Interrupt* interrupt,
           const Tuning& tuning) {
  // Everything after `migrate-store`, --help included, is ballastd's
  // (client/migrate_store.h), which CLI11 would check against ballast's flags.
  if (argc >= 2 && std::string_view(argv[1]) == "migrate-store") {
    return MigrateStore(io, std::vector<std::string>(argv + 2, argv + argc));
  }
  CLI::App app{"ballast: submit and watch finetuning jobs", "ballast"};
  app.set_version_flag("--version", VersionLine("ballast"));
  std::string coordinator = "localhost:50051";
  std::string output = "table";
  double timeout_s = 10;
  bool verbose = false;
  app.add_option("--coordinator", coordinator,
                 "Coordinator address, HOST:PORT, or several separated by commas (a leader and "
                 "its standbys: calls follow the leader through a failover)")
      ->envname("BALLAST_COORDINATOR")
      ->capture_default_str();
  app.add_flag("-v,--verbose", verbose, "Say on stderr which coordinator answered");
  app.add_option("-o,--output", output, "Output format")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  TlsFiles tls;
  app.add_option("--tls-ca", tls.ca, "PEM CA bundle that verifies ballastd's certificate (TLS)")
      ->envname("BALLAST_TLS_CA");
  app.add_option("--timeout", timeout_s, "Deadline of each call, in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  // Lets the global flags follow the subcommand too: `ballast get ID -o json`.
  app.fallthrough();
  app.require_subcommand(1);

  SubmitArgs submit_args;
  CLI::App* submit = app.add_subcommand("submit", "Submit a job spec (YAML)");
  submit->add_option("file", submit_args.file, "Job spec file")->required();
  submit->add_option("--set", submit_args.overrides, "Override a spec key: key.path=value")
      ->allow_extra_args(false);
  submit->add_flag("--wait", submit_args.wait, "Watch the job until it ends");
  submit->add_option("--request-id", submit_args.request_id,
                     "Idempotency key (default: a random UUID)");

  ListArgs list_args;
  CLI::App* list = app.add_subcommand("list", "List jobs, newest first");
  list->add_option("--state", list_args.states, "Only jobs in this state (repeatable)")
      ->allow_extra_args(false);
  list->add_option("--limit", list_args.limit, "Most jobs shown")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();

  std::string job_id;
  auto add_job_command = [&](const char* name, const char* help) {
    CLI::App* command = app.add_subcommand(name, help);
    command->add_option("id", job_id, "Job id")->required();
    return command;
  };
  CLI::App* get = add_job_command("get", "Show a job");
  CLI::App* watch = add_job_command("watch", "Follow a job's progress until it ends");
  CLI::App* cancel = add_job_command("cancel", "Cancel a job");
  CLI::App* rollback = add_job_command("rollback", "Restart a job from an earlier checkpoint");
  int64_t to_step = 0;
  rollback
      ->add_option("--to-step", to_step,
                   "Newest good checkpoint at or before this step; 0 starts over from the "
                   "initial weights")
      ->required()
      ->check(CLI::NonNegativeNumber);
  CLI::App* logs = add_job_command("logs", "Print a job's log lines");
  bool follow = false;
  logs->add_flag("-f,--follow", follow, "Keep printing until the job ends");
  CLI::App* plot = add_job_command("plot", "Chart a job's loss and grad_norm as SVG");
  std::string plot_path;
  plot->add_option("-o,--out", plot_path, "The SVG file to write")->required();
  CLI::App* workers = app.add_subcommand("workers", "List the workers");
  CLI::App* health = app.add_subcommand(
      "health", "Check the coordinator's grpc.health.v1 status (exit 0 when SERVING)");

  CLI::App* token = app.add_subcommand("token", "Manage API tokens (an admin's token)");
  token->require_subcommand(1);
  TokenCreateArgs token_args;
  CLI::App* token_create = token->add_subcommand("create", "Make a token; prints its secret once");
  token_create->add_option("--role", token_args.role, "admin, user or worker")->required();
  token_create->add_option("--tenant", token_args.tenant,
                           "The tenant of an admin or user token: a-z, 0-9 and '-'");
  token_create->add_option("--worker-id", token_args.worker_id,
                           "The worker id a worker token registers as");
  token_create->add_option("--description", token_args.description, "Who or what it is for");
  CLI::App* token_list = token->add_subcommand("list", "List the tokens (never their secrets)");
  std::string token_id;
  CLI::App* token_revoke = token->add_subcommand("revoke", "Revoke a token at once");
  token_revoke->add_option("id", token_id, "Token id (tok-...)")->required();

  // Listed for --help; run above, before parsing.
  app.add_subcommand("migrate-store",
                     "Copy a coordinator's store, SQLite to PostgreSQL or back, and check the "
                     "copy: `ballast migrate-store FROM TO` runs `ballastd migrate-store` (see "
                     "its --help)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e, *io.out, *io.err);  // --help, --version
    *io.err << "ballast: " << e.what() << "\nRun with --help for more information.\n";
    return kExitUsage;
  }

  ConnectionOptions options;
  options.address = coordinator;
  options.verbose = verbose;
  if (const char* token = std::getenv("BALLAST_TOKEN")) options.token = token;
  options.unary_timeout = absl::Seconds(timeout_s);
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      GrpcChannelCredentials(tls, "--tls-");
  if (!credentials.ok()) {
    *io.err << "ballast: " << credentials.status().message() << "\n";
    return kExitUsage;
  }
  options.credentials = *std::move(credentials);
  Connection connection(options, interrupt);
  Session session{.connection = &connection,
                  .format = output == "json" ? OutputFormat::kJson : OutputFormat::kTable,
                  .io = io,
                  .tuning = tuning};

  if (*submit) return Submit(session, submit_args);
  if (*list) return List(session, list_args);
  if (*get) return Get(session, job_id);
  if (*watch) return Watch(session, job_id);
  if (*cancel) return Cancel(session, job_id);
  if (*rollback) return Rollback(session, job_id, to_step);
  if (*logs) return Logs(session, job_id, follow);
  if (*plot) return Plot(session, job_id, plot_path);
  if (*workers) return Workers(session);
  if (*health) return Health(session);
  if (*token_create) return TokenCreate(session, token_args);
  if (*token_list) return TokenList(session);
  if (*token_revoke) return TokenRevoke(session, token_id);
  return kExitUsage;  // require_subcommand(1) makes this unreachable
}

}  // namespace ballast::client
