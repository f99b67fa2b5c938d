// ballast-worker: the per-node agent that runs ballast-train ranks. It does not link LibTorch.
#include <CLI/CLI.hpp>
#include <iostream>

#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{"ballast-worker: registers this node's devices and runs trainer ranks"};
  std::string coordinator = "localhost:50051";
  int cpu_slots = 0;
  app.set_version_flag("--version", ballast::VersionLine("ballast-worker"));
  app.add_option("--coordinator", coordinator, "Coordinator address, HOST:PORT")
      ->envname("BALLAST_COORDINATOR")
      ->capture_default_str();
  app.add_option("--cpu-slots", cpu_slots, "CPU trainer slots to offer where there is no GPU")
      ->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);

  std::cerr << "ballast-worker: the worker agent is not implemented yet in this build\n";
  return 1;
}
