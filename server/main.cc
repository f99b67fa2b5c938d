// ballastd: the Ballast coordinator. It does not link LibTorch.
//
// Flags are the table in docs/control-plane.md. Once serving it prints
//   ballastd: serving gRPC on HOST:PORT, HTTP on HOST:PORT, store URL
// (the store's URL without its password; "; standing by" when another
// coordinator leads the same PostgreSQL store)
// to stderr and, with --ready-file, writes {"grpc": "HOST:PORT", "http":
// "HOST:PORT"} there atomically. SIGINT or SIGTERM shut it down cleanly
// (streams ended, store closed) with exit code 0.
//
// `ballastd migrate-store FROM TO` copies a store instead of serving
// (server/store_migration.h); `ballast migrate-store` runs it.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "server/elected_ballastd.h"
#include "server/store_migration.h"
#include "server/store_rows.h"

namespace {

namespace fs = std::filesystem;

std::string DefaultStateDir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (fs::path(xdg) / "ballast").string();
  }
  const char* home = std::getenv("HOME");
  return (fs::path(home != nullptr ? home : ".") / ".local/state/ballast").string();
}

// Write, then rename: a reader never sees half a file.
bool WriteReadyFile(const std::string& path, const std::string& grpc, const std::string& http) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"grpc", grpc}, {"http", http}}.dump() << "\n";
    if (!out.flush()) return false;
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  return !ec;
}

// `ballastd migrate-store FROM TO`: 0 when the copy checks out, 1 when it
// fails or does not, 2 for a bad URL.
int RunMigrateStore(const std::string& from, const std::string& to,
                    const ballast::server::MigrateOptions& options) {
  absl::StatusOr<ballast::server::MigrationReport> report =
      ballast::server::MigrateStore(from, to, options);
  if (!report.ok()) {
    std::cerr << "ballastd migrate-store: " << report.status().message() << "\n";
    return report.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cout << "copied " << ballast::server::RedactStoreUrl(from) << " to "
            << ballast::server::RedactStoreUrl(to) << "\n"
            << ballast::server::FormatMigrationReport(*report);
  if (!report->verified()) {
    std::cerr << "ballastd migrate-store: the target does not read back as the source: a table's "
                 "rows or checksum differ (above)\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ballastd: the Ballast coordinator (job store, scheduler, gRPC API)"};
  ballast::server::BallastdOptions options;
  std::string state_dir = DefaultStateDir();
  std::string ready_file;
  app.set_version_flag("--version", ballast::VersionLine("ballastd"));
  app.add_option("--listen", options.listen, "gRPC address, HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--http", options.http,
                 "HTTP address for /metrics and /healthz, HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir, "Holds the default store and job outputs")
      ->capture_default_str();
  // From the environment too, so that a URL from a Secret never shows on the
  // command line (deploy/helm, deploy/compose).
  app.add_option("--store", options.store_url,
                 "Job store URL: sqlite:PATH or postgresql://... (default "
                 "sqlite:STATE_DIR/ballastd.db)")
      ->envname("BALLAST_STORE");
  app.add_option("--output-root", options.output_root,
                 "A job's output_dir is OUTPUT_ROOT/JOB_ID (default STATE_DIR/jobs)");
  app.add_option("--path-root", options.path_roots,
                 "Specs' model, adapter, tokenizer and data paths must lie in this folder "
                 "(repeatable; symlinks and .. resolved); without it any path is allowed");
  app.add_option("--lease-ms", options.lease_ms, "A worker silent this long loses its ranks")
      ->capture_default_str();
  app.add_option("--event-retention", options.event_retention,
                 "Events kept per job; older ones are deleted and counted")
      ->capture_default_str();
  app.add_option("--job-history", options.job_history,
                 "Finished jobs the store keeps, newest first, with their events; older ones "
                 "are deleted (0 keeps every job)")
      ->capture_default_str();
  app.add_option("--metrics-retention-ms", options.metrics_retention_ms,
                 "A finished job's series stay on /metrics this long")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--stop-grace-ms", options.stop_grace_ms,
                 "Cancel -> SIGKILL delay sent with stop assignments")
      ->capture_default_str();
  app.add_option("--agent-silence-ms", options.agent_silence_ms,
                 "A rank whose worker sends no keepalive this long stops by itself; a lost "
                 "worker's jobs wait this long (+1 s) after its lease (default: half the lease)");
  app.add_option("--tls-cert", options.tls.cert,
                 "PEM certificate chain: serve gRPC and HTTP over TLS (with --tls-key)");
  app.add_option("--tls-key", options.tls.key, "The private key of --tls-cert");
  app.add_option("--tls-client-ca", options.tls.ca,
                 "PEM CA that signs workers' client certificates: a worker token's calls then "
                 "need one whose CN is its worker id (mTLS)");
  std::vector<std::string> quotas;
  app.add_option("--quota", quotas,
                 "Per-tenant limit, TENANT:max_devices=N,max_queued_jobs=M (0: none; TENANT * "
                 "for every tenant not named); repeatable")
      ->allow_extra_args(false);
  std::vector<std::string> openai_models;
  app.add_option("--openai-model", openai_models,
                 "A model name the OpenAI-compatible API takes, NAME=PATH (an absolute model "
                 "folder); repeatable (docs/openai-api.md)")
      ->allow_extra_args(false);
  app.add_option("--openai-max-file-bytes", options.openai_max_file_bytes,
                 "The largest file POST /v1/files takes, in bytes")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--advertise", options.advertise,
                 "With a PostgreSQL store: the gRPC address, HOST:PORT, that a standby names to "
                 "clients when this ballastd leads (default: the bound --listen address)");
  app.add_option("--leader-lease-ms", options.leader_lease_ms,
                 "With a PostgreSQL store: the leader renews its lease every fifth of this; a "
                 "standby takes over once it has expired")
      ->capture_default_str();
  app.add_option("--ready-file", ready_file,
                 "Once serving, write {\"grpc\": \"HOST:PORT\", \"http\": \"HOST:PORT\"} here");

  std::string migrate_from;
  std::string migrate_to;
  ballast::server::MigrateOptions migrate_options;
  CLI::App* migrate = app.add_subcommand(
      "migrate-store",
      "Copy a store (every job, its events, workers, tokens) into an empty one, SQLite to "
      "PostgreSQL or back, then check rows and checksums per table (docs/control-plane.md)");
  migrate->add_option("from", migrate_from, "The source: sqlite:PATH or postgresql://...")
      ->required();
  migrate->add_option("to", migrate_to, "The target: sqlite:PATH or postgresql://...")->required();
  migrate->add_flag("--allow-non-empty", migrate_options.allow_non_empty,
                    "Copy into a target that holds rows (a rerun after a copy that stopped); rows "
                    "with the same key are replaced");
  CLI11_PARSE(app, argc, argv);
  if (*migrate) return RunMigrateStore(migrate_from, migrate_to, migrate_options);

  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec) {
    std::cerr << "ballastd: --state-dir " << state_dir << ": " << ec.message() << "\n";
    return 1;
  }
  if (options.store_url.empty()) {
    options.store_url = "sqlite:" + (fs::path(state_dir) / "ballastd.db").string();
  }
  if (options.output_root.empty()) options.output_root = (fs::path(state_dir) / "jobs").string();
  fs::create_directories(options.output_root, ec);
  if (ec) {
    std::cerr << "ballastd: --output-root " << options.output_root << ": " << ec.message() << "\n";
    return 1;
  }
  if (const char* token = std::getenv("BALLAST_TOKEN")) options.token = token;
  for (const std::string& model : openai_models) {
    if (absl::Status s = ballast::server::ParseOpenAiModelFlag(model, &options.openai_models);
        !s.ok()) {
      std::cerr << "ballastd: " << s.message() << "\n";
      return 2;
    }
  }
  for (const std::string& quota : quotas) {
    if (absl::Status s = ballast::server::ParseQuotaFlag(quota, &options.quotas); !s.ok()) {
      std::cerr << "ballastd: " << s.message() << "\n";
      return 2;
    }
  }

  // Every thread started from here on inherits the blocked signals, so only
  // sigwait below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<ballast::server::ElectedBallastd>> server =
      ballast::server::ElectedBallastd::Start(options);
  if (!server.ok()) {
    std::cerr << "ballastd: " << server.status().message() << "\n";
    // A flag's value that can never start (a store URL of no known scheme)
    // is a usage error, exit 2, as a flag's parse error is; a start that may
    // work later (a store not reachable yet, a port taken) exits 1.
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::cerr << "ballastd: serving gRPC on " << (*server)->grpc_address() << ", HTTP on "
            << (*server)->http_address() << ", store "
            << ballast::server::RedactStoreUrl(options.store_url)
            << ((*server)->leading() ? "" : "; standing by") << std::endl;
  if (options.token.empty()) {
    std::cerr << "ballastd: no BALLAST_TOKEN: no auth (every caller is an admin), so on "
                 "loopback only; set it to listen on other addresses and to make tokens"
              << std::endl;
  }
  if (!ready_file.empty() &&
      !WriteReadyFile(ready_file, (*server)->grpc_address(), (*server)->http_address())) {
    std::cerr << "ballastd: cannot write --ready-file " << ready_file << "\n";
    return 1;
  }

  // A term that cannot start (its ports taken meanwhile) ends the process,
  // through the same path as a signal.
  std::thread watcher([&server] {
    (*server)->WaitForFailure();
    if (!(*server)->failure().ok()) kill(getpid(), SIGTERM);
  });
  int signal = 0;
  sigwait(&signals, &signal);
  const absl::Status failure = (*server)->failure();
  std::cerr << "ballastd: "
            << (failure.ok() ? std::string(strsignal(signal)) : std::string(failure.message()))
            << ", shutting down" << std::endl;
  (*server)->Shutdown();
  watcher.join();
  std::cerr << "ballastd: stopped" << std::endl;
  return failure.ok() ? 0 : 1;
}
