// The `ballast` command line: flags, subcommands, and dispatch to commands.h.
#ifndef BALLAST_CLIENT_CLI_H_
#define BALLAST_CLIENT_CLI_H_

#include "client/commands.h"
#include "client/interrupt.h"

namespace ballast::client {

// Parses argv and runs the chosen command; returns the process exit code
// (usage errors, including CLI11's, give 2). Reads BALLAST_COORDINATOR and
// BALLAST_TOKEN from the environment. `interrupt` must outlive the call.
int RunCli(int argc, const char* const* argv, const Io& io, Interrupt* interrupt,
           const Tuning& tuning = {});

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_CLI_H_
