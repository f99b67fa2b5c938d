// LocalRanks: `ballast-train --nproc N`, a standalone multi-rank run on one
// machine without a coordinator. The launcher starts N copies of a program
// (ballast-train itself) as ranks 0..N-1 that meet at 127.0.0.1 on a free
// port, and waits for them as a worker and a coordinator would for a gang:
//
//  - A rank that fails (non-zero exit or a signal) ends the others: SIGTERM,
//    which a trainer takes at its next step boundary, then SIGKILL after the
//    grace. The launcher returns the first failure's code and says which rank
//    failed and how.
//  - SIGINT and SIGTERM sent to the launcher go to every rank still running
//    (each signal once per rank, so a trainer's "second SIGTERM kills at
//    once" stays the user's choice).
//  - Each rank's stderr reaches the launcher's, line by line, as "[rank R] ".
//  - Without OMP_NUM_THREADS in the environment, it is set to the cores
//    divided by N (at least 1), so the ranks do not fight over the cores.
//
// No LibTorch here, so it builds and tests without it. Not thread-safe: it
// blocks SIGINT, SIGTERM and SIGCHLD in the calling thread while it runs, so
// call it from main() before any other thread exists.
#ifndef BALLAST_WORKER_TRAIN_RANK_LOCAL_RANKS_H_
#define BALLAST_WORKER_TRAIN_RANK_LOCAL_RANKS_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::train {

struct LocalRanksOptions {
  // The program every rank runs, and its arguments (argv[1..]). Rank R gets
  // `--rank R --world-size N --master-addr 127.0.0.1 --master-port P` after
  // them.
  std::string binary;
  std::vector<std::string> args;
  // argv[0] of every rank, what `ps` shows; `binary` when empty.
  std::string argv0;
  // Ranks to start, >= 1.
  int nproc = 1;
  // How long a rank asked to stop after another one failed gets before SIGKILL.
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
  // Where the ranks' prefixed stderr lines and the launcher's own messages go.
  int err_fd = 2;
};

// Starts the ranks and waits until every one has exited. Returns 0 when all
// exited 0, else the first failure's exit code (128 + signal number for a
// rank killed by a signal). INTERNAL when no port could be picked or a rank
// could not be started (the ranks already started are killed and reaped).
absl::StatusOr<int> RunLocalRanks(const LocalRanksOptions& options);

// argv[1..argc-1] without `option VALUE` and `option=VALUE`: the launcher's
// own command line turned into its ranks'.
std::vector<std::string> ArgumentsWithout(int argc, const char* const* argv,
                                          const std::string& option);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_LOCAL_RANKS_H_
