// Device discovery: what this node offers the coordinator, found without
// LibTorch. CUDA GPUs come from NVML (dlopen of libnvidia-ml.so.1), with
// `nvidia-smi` as the fallback; `--cpu-slots N` replaces both.
//
// Thread-compatible: plain functions without shared state.
#ifndef BALLAST_WORKER_AGENT_DEVICE_DISCOVERY_H_
#define BALLAST_WORKER_AGENT_DEVICE_DISCOVERY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast::agent {

// The devices a worker registers: kind "cuda" or "cpu", one name per device.
struct Devices {
  std::string kind;
  std::vector<std::string> names;
};

// With cpu_slots > 0: that many CPU slots named "cpu-0", "cpu-1", ... .
// Otherwise the CUDA devices from NVML, else from nvidia-smi. NOT_FOUND with a
// message naming both ways out when neither finds a GPU. INVALID_ARGUMENT when
// cpu_slots is negative or above 4096 (the coordinator's capacity limit).
absl::StatusOr<Devices> DiscoverDevices(int cpu_slots);

// The GPU names NVML reports; empty when the library is absent or fails.
std::vector<std::string> NvmlDeviceNames();

// The GPU names `nvidia-smi --query-gpu=name --format=csv,noheader` prints;
// empty when the tool is absent or fails.
std::vector<std::string> NvidiaSmiDeviceNames();

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_DEVICE_DISCOVERY_H_
