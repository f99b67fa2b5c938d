// ballast-worker: the per-node agent that runs ballast-train ranks for the
// coordinator (docs/control-plane.md, "Workers"). It does not link LibTorch.
//
//   ballast-worker [--coordinator HOST:PORT[,HOST:PORT...]] [--cpu-slots N] [--work-dir DIR]
//                  [--train-binary PATH] [--host NAME] [--shared-dir DIR]...
//                  [--http HOST:PORT]
//
// Exit codes: 0 after SIGTERM/SIGINT, 1 when it cannot start, 2 on bad
// flags or when there is nothing to offer (no GPU and no --cpu-slots).
#include <limits.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "common/http_endpoint.h"
#include "common/metrics.h"
#include "common/version.h"
#include "worker/agent/agent.h"
#include "worker/agent/device_discovery.h"
#include "worker/agent/shared_storage.h"

namespace {

namespace fs = std::filesystem;

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

std::string DefaultWorkDir() {
  const std::string state = EnvOr("XDG_STATE_HOME", EnvOr("HOME", "/tmp") + "/.local/state");
  return state + "/ballast/worker";
}

std::string DefaultTrainBinary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "ballast-train" : (self.parent_path() / "ballast-train").string();
}

std::string Hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  return gethostname(name, sizeof(name)) == 0 ? name : "localhost";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ballast-worker: registers this node's devices and runs trainer ranks"};
  ballast::agent::AgentOptions options;
  options.coordinator = EnvOr("BALLAST_COORDINATOR", "localhost:50051");
  options.work_dir = DefaultWorkDir();
  options.train_binary = DefaultTrainBinary();
  options.host = Hostname();
  int cpu_slots = 0;
  app.set_version_flag("--version", ballast::VersionLine("ballast-worker"));
  app.add_option("--coordinator", options.coordinator,
                 "Coordinator address, HOST:PORT, or several separated by commas (a leader "
                 "and its standbys: the worker follows the leader) (default "
                 "$BALLAST_COORDINATOR or localhost:50051)")
      ->capture_default_str();
  app.add_option("--cpu-slots", cpu_slots, "Offer N CPU slots instead of CUDA devices")
      ->check(CLI::Range(0, 4096));
  app.add_option("--work-dir", options.work_dir, "Worker id file and rank scratch folders")
      ->capture_default_str();
  app.add_option("--train-binary", options.train_binary, "The ballast-train to run ranks with")
      ->capture_default_str();
  app.add_option("--collective-timeout", options.collective_timeout_s,
                 "Seconds a rank of a multi-rank job may go without a heartbeat (stopped, "
                 "frozen, cut off) before its peers count it lost and the job restarts; give "
                 "every worker the same value")
      ->check(CLI::Range(1.0, 3600.0))
      ->capture_default_str();
  app.add_option("--host", options.host, "The address other nodes reach this one at")
      ->capture_default_str();
  std::vector<std::string> shared_dirs;
  app.add_option("--shared-dir", shared_dirs,
                 "Shared storage this node must see before it runs ranks (models, data, "
                 "outputs); repeatable")
      ->allow_extra_args(false);
  app.add_option("--tls-ca", options.tls.ca,
                 "PEM CA bundle that verifies ballastd's certificate: TLS to the coordinator")
      ->envname("BALLAST_TLS_CA");
  app.add_option("--tls-cert", options.tls.cert,
                 "PEM client certificate (CN = this worker's id) for ballastd's mTLS")
      ->envname("BALLAST_TLS_CERT");
  app.add_option("--tls-key", options.tls.key, "The private key of --tls-cert")
      ->envname("BALLAST_TLS_KEY");
  std::string http;
  app.add_option("--http", http,
                 "Serve /metrics and /healthz on HOST:PORT (port 0: any free port); off when "
                 "empty");
  CLI11_PARSE(app, argc, argv);
  options.token = EnvOr("BALLAST_TOKEN", "");
  if (absl::Status s = ballast::agent::CheckSharedStorage(shared_dirs); !s.ok()) {
    std::cerr << "ballast-worker: " << s.message() << "\n";
    return 1;
  }

  absl::StatusOr<ballast::agent::Devices> devices = ballast::agent::DiscoverDevices(cpu_slots);
  if (!devices.ok()) {
    std::cerr << "ballast-worker: " << devices.status().message() << "\n";
    return 2;
  }
  options.devices = *std::move(devices);

  // Blocked before any thread exists, so every thread (gRPC's included)
  // inherits the mask and the signals wait for sigwait below. Ranks get an
  // empty mask back at spawn.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  // A closed stdout must not kill the worker and orphan its ranks; ranks get
  // the default disposition back at spawn.
  signal(SIGPIPE, SIG_IGN);

  ballast::agent::Agent agent(options);
  if (absl::Status s = agent.Start(); !s.ok()) {
    std::cerr << "ballast-worker: " << s.message() << "\n";
    return 1;
  }
  ballast::MetricsRegistry metrics;
  metrics.AddCollectable(&agent);
  std::unique_ptr<ballast::HttpEndpoint> endpoint;
  if (!http.empty()) {
    std::string host;
    int port = 0;
    if (absl::Status s = ballast::SplitHostPort(http, "--http", &host, &port); !s.ok()) {
      std::cerr << "ballast-worker: " << s.message() << "\n";
      return 2;
    }
    absl::StatusOr<std::unique_ptr<ballast::HttpEndpoint>> started = ballast::HttpEndpoint::Start(
        host, port, &metrics, [&agent] { return agent.Health(); },
        // A worker token is this node's credential to ballastd; Prometheus
        // holds another (BALLAST_METRICS_TOKEN) for every worker alike.
        ballast::BearerTokenCheck(EnvOr("BALLAST_METRICS_TOKEN", options.token)));
    if (!started.ok()) {
      std::cerr << "ballast-worker: " << started.status().message() << "\n";
      return 1;
    }
    endpoint = *std::move(started);
    std::cout << "ballast-worker: metrics on http://" << http.substr(0, http.rfind(':')) << ":"
              << endpoint->port() << "/metrics" << std::endl;
  }
  std::cout << "ballast-worker: " << options.devices.names.size() << " " << options.devices.kind
            << " devices, coordinator " << options.coordinator << ", work dir " << options.work_dir
            << ", trainer " << options.train_binary << std::endl;
  int received = 0;
  sigwait(&signals, &received);
  std::cout << "ballast-worker: " << (received == SIGINT ? "SIGINT" : "SIGTERM")
            << ": stopping ranks" << std::endl;
  endpoint.reset();
  agent.Shutdown();
  return 0;
}
