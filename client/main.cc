// ballast: the command-line client of the coordinator. It does not link LibTorch.
#include <CLI/CLI.hpp>
#include <iostream>

#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{"ballast: submit and watch finetuning jobs"};
  std::string coordinator = "localhost:50051";
  app.set_version_flag("--version", ballast::VersionLine("ballast"));
  app.add_option("--coordinator", coordinator, "Coordinator address, HOST:PORT")
      ->envname("BALLAST_COORDINATOR")
      ->capture_default_str();
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  std::cerr << "ballast: the job commands are not implemented yet in this build\n";
  return 2;
}
