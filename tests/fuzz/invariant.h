// Require: how a fuzz target reports a broken invariant. It aborts, so
// libFuzzer keeps the input as a crash and the CTest fuzz.<name>
// (replay_main.cc) fails on it.
#ifndef BALLAST_TESTS_FUZZ_INVARIANT_H_
#define BALLAST_TESTS_FUZZ_INVARIANT_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

namespace ballast::fuzz {

// Aborts naming `what`, and `status` when one is given, unless `holds`.
inline void Require(bool holds, const char* what, const absl::Status& status = absl::OkStatus()) {
  if (holds) return;
  std::fprintf(stderr, "invariant broken: %s%s%s\n", what, status.ok() ? "" : ": ",
               status.ok() ? "" : status.ToString().c_str());
  std::abort();
}

}  // namespace ballast::fuzz

#endif  // BALLAST_TESTS_FUZZ_INVARIANT_H_
