// ballast: the command-line client of the coordinator. It does not link LibTorch.
#include <unistd.h>

#include <iostream>

#include "client/cli.h"
#include "client/interrupt.h"

int main(int argc, char** argv) {
  ballast::client::Interrupt interrupt;
  // Before anything starts a thread (gRPC does), so SIGINT reaches only the router.
  ballast::client::SigintRouter sigint(&interrupt);
  const ballast::client::Io io{
      .out = &std::cout, .err = &std::cerr, .tty = isatty(STDOUT_FILENO) == 1};
  return ballast::client::RunCli(argc, argv, io, &interrupt);
}
