// What this ballast-train binary can compute on (LibTorch, CUDA, NCCL), and
// which device a rank of a job uses.
#ifndef BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_
#define BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_

#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::train {

// Multi-line report for `ballast-train --version`: the LibTorch version, and
// for CUDA and NCCL whether they are compiled in and whether they are usable
// on this machine (a device is present and the driver loads).
std::string DescribeBackends();

// The CUDA devices this process can use.
struct VisibleDevices {
  // Ballast's CUDA kernels and LibTorch's CUDA are both in this binary.
  bool cuda_built = false;
  // Devices the driver reports, after CUDA_VISIBLE_DEVICES; 0 without a
  // driver.
  int cuda_devices = 0;
  // CUDA_VISIBLE_DEVICES when set: a worker sets it to the rank's GPU, or to
  // "" for a CPU slot.
  std::optional<std::string> cuda_visible_devices;
};
VisibleDevices ProbeDevices();

// The device of the spec's `device` ("auto", "cpu", "cuda"; see
// proto/ballast/v1/job_spec.proto): a rank uses the first visible GPU,
// cuda:0, since its worker makes its own GPU the only visible one. "auto" is
// cuda:0 when a GPU is visible and cpu otherwise. INVALID_ARGUMENT for
// "cuda" without a usable GPU, saying what was found.
absl::StatusOr<c10::Device> ChooseDevice(const std::string& device, const VisibleDevices& found);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_DEVICE_INFO_H_
