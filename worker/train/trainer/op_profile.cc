#include "worker/train/trainer/op_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/train/trainer/torch_status.h"

namespace ballast::train {
namespace {

namespace profiler = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

}  // namespace

absl::StatusOr<std::unique_ptr<OpProfile>> OpProfile::Start(const std::string& path,
                                                            c10::Device device) {
  // Written now, so that a path that cannot be written fails before the run
  // rather than after it.
  if (!std::ofstream(path).good()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile ", path, ": cannot write it: ", std::strerror(errno)));
  }
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (device.is_cuda()) activities.insert(ActivityType::CUDA);
  return CatchTorch([&]() -> absl::StatusOr<std::unique_ptr<OpProfile>> {
    // Without the prepare step, enabling Kineto from C++ (no Python to have
    // initialised it) crashes in LibTorch 2.11.
    profiler::prepareProfiler(config, activities);
    profiler::enableProfiler(config, activities);
    return std::unique_ptr<OpProfile>(new OpProfile(path));
  });
}

absl::Status OpProfile::Finish() {
  recording_ = false;
  return CatchTorch([&]() -> absl::Status {
    profiler::disableProfiler()->save(path_);
    return absl::OkStatus();
  });
}

OpProfile::~OpProfile() {
  if (!recording_) return;
  try {
    profiler::disableProfiler();
  } catch (const std::exception&) {
    // Nothing to write to, and the run's own status is what is reported.
  }
}

std::string RankProfilePath(const std::string& path, int rank, int world_size) {
  if (world_size <= 1) return path;
  const std::string stem = absl::EndsWith(path, ".json") ? path.substr(0, path.size() - 5) : path;
  return absl::StrCat(stem, ".rank", rank, ".json");
}

}  // namespace ballast::train
