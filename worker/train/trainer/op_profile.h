// OpProfile: torch's profiler over a run, written as a Chrome trace (open it in
// Perfetto or chrome://tracing). Every ATen op and autograd node on the CPU is
// an event with its input shapes and time; on CUDA the GPU's kernels too; each
// step is a user scope "ballast::step". bench/op_profile.py sums a trace by op.
//
// It is for finding where a step's time goes, not for production runs: it
// slows the step, and the file grows by about 2 MB a step of the benchmarks'
// tiny model, so profile a few steps.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_OP_PROFILE_H_
#define BALLAST_WORKER_TRAIN_TRAINER_OP_PROFILE_H_

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ballast::train {

// The scope each step runs in, by which a trace's steps are told apart.
inline constexpr char kStepScope[] = "ballast::step";

class OpProfile {
 public:
  // Checks that `path` can be written (INVALID_ARGUMENT naming it if not),
  // then starts recording on this thread, the one that runs the steps and,
  // on the CPU, their backward.
  static absl::StatusOr<std::unique_ptr<OpProfile>> Start(const std::string& path,
                                                          c10::Device device);

  // Stops recording and writes the trace.
  absl::Status Finish();

  // Stops recording without writing, when Finish was not called.
  ~OpProfile();

  OpProfile(const OpProfile&) = delete;
  OpProfile& operator=(const OpProfile&) = delete;

 private:
  explicit OpProfile(std::string path) : path_(std::move(path)) {}

  std::string path_;
  bool recording_ = true;
};

// The trace file of rank `rank` of `world_size`: `path` itself for one rank;
// for several, rank R's is path with ".rankR" before its ".json".
std::string RankProfilePath(const std::string& path, int rank, int world_size);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_OP_PROFILE_H_
