#include "worker/agent/device_discovery.h"

#include <dlfcn.h>

#include <cstdio>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace ballast::agent {
namespace {

// NVML's C API, declared here because the worker must build on machines
// without the CUDA toolkit; the signatures are NVML's stable v2 ABI.
using NvmlReturn = int;
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlNameLength = 96;  // NVML_DEVICE_NAME_V2_BUFFER_SIZE

struct DlCloser {
  void operator()(void* handle) const { dlclose(handle); }
};

}  // namespace

std::vector<std::string> NvmlDeviceNames() {
  std::unique_ptr<void, DlCloser> lib(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL));
  if (lib == nullptr) return {};
  auto init = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib.get(), "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib.get(), "nvmlShutdown"));
  auto count =
      reinterpret_cast<NvmlReturn (*)(unsigned*)>(dlsym(lib.get(), "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<NvmlReturn (*)(unsigned, NvmlDevice*)>(
      dlsym(lib.get(), "nvmlDeviceGetHandleByIndex_v2"));
  auto name = reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(
      dlsym(lib.get(), "nvmlDeviceGetName"));
  if (!init || !shutdown || !count || !handle || !name || init() != kNvmlSuccess) return {};
  std::vector<std::string> names;
  unsigned n = 0;
  if (count(&n) == kNvmlSuccess) {
    for (unsigned i = 0; i < n; ++i) {
      NvmlDevice device = nullptr;
      char buf[kNvmlNameLength] = {};
      if (handle(i, &device) != kNvmlSuccess || name(device, buf, sizeof(buf)) != kNvmlSuccess) {
        // Keeps ordinals aligned with CUDA_VISIBLE_DEVICES even for a device
        // whose name cannot be read.
        names.push_back(absl::StrCat("cuda-", i));
      } else {
        names.push_back(buf);
      }
    }
  }
  shutdown();
  return names;
}

std::vector<std::string> NvidiaSmiDeviceNames() {
  struct PipeCloser {
    void operator()(FILE* f) const { pclose(f); }
  };
  std::unique_ptr<FILE, PipeCloser> pipe(
      popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null", "re"));
  if (pipe == nullptr) return {};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe.get())) > 0;) out.append(buf, n);
  if (pclose(pipe.release()) != 0) return {};
  std::vector<std::string> names;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    names.emplace_back(absl::StripAsciiWhitespace(line));
  }
  return names;
}

absl::StatusOr<Devices> DiscoverDevices(int cpu_slots) {
  if (cpu_slots < 0 || cpu_slots > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-slots = ", cpu_slots, " is out of range; allowed: 0..4096"));
  }
  if (cpu_slots > 0) {
    Devices d{"cpu", {}};
    for (int i = 0; i < cpu_slots; ++i) d.names.push_back(absl::StrCat("cpu-", i));
    return d;
  }
  std::vector<std::string> names = NvmlDeviceNames();
  if (names.empty()) names = NvidiaSmiDeviceNames();
  if (names.empty()) {
    return absl::NotFoundError(
        "no CUDA device found (NVML libnvidia-ml.so.1 and nvidia-smi report none); "
        "pass --cpu-slots N to offer CPU slots instead");
  }
  if (names.size() > 4096) names.resize(4096);
  return Devices{"cuda", std::move(names)};
}

}  // namespace ballast::agent
