// ballastd: the Ballast coordinator. It does not link LibTorch.
#include <CLI/CLI.hpp>
#include <iostream>

#include "common/version.h"

int main(int argc, char** argv) {
  CLI::App app{"ballastd: the Ballast coordinator (job store, scheduler, gRPC API)"};
  std::string listen = "127.0.0.1:50051";
  std::string http = "127.0.0.1:9090";
  std::string store;
  app.set_version_flag("--version", ballast::VersionLine("ballastd"));
  app.add_option("--listen", listen, "gRPC address, HOST:PORT")->capture_default_str();
  app.add_option("--http", http, "HTTP address for /metrics and /healthz, HOST:PORT")
      ->capture_default_str();
  app.add_option("--store", store, "Job store URL (default sqlite: in the state directory)");
  CLI11_PARSE(app, argc, argv);

  // The services come with the control-plane issue; until then say so plainly
  // rather than pretend to serve.
  std::cerr << "ballastd: the coordinator service is not implemented yet in this build\n";
  return 1;
}
