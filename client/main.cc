// ballast: the command-line client of the coordinator. It does not link LibTorch.
#include <sys/ioctl.h>
#include <unistd.h>

#include <iostream>

#include "client/cli.h"
#include "client/interrupt.h"

int main(int argc, char** argv) {
  ballast::client::Interrupt interrupt;
  // Before anything starts a thread (gRPC does), so SIGINT reaches only the router.
  ballast::client::SigintRouter sigint(&interrupt);
  const bool tty = isatty(STDOUT_FILENO) == 1;
  winsize size{};
  const int columns = tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 ? size.ws_col : 0;
  const ballast::client::Io io{
      .out = &std::cout, .err = &std::cerr, .tty = tty, .columns = columns};
  return ballast::client::RunCli(argc, argv, io, &interrupt);
}
