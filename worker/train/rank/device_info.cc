#include "worker/train/rank/device_info.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <cstdlib>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifdef BALLAST_WITH_CUDA
#include <torch/csrc/cuda/nccl.h>
#endif

namespace ballast::train {
namespace {

std::string Describe(bool compiled, bool available, const std::string& detail) {
  std::string s = compiled ? "compiled in" : "not compiled in";
  s += available ? ", available" : ", not available";
  if (!detail.empty()) s += " (" + detail + ")";
  return s;
}

}  // namespace

std::string DescribeBackends() {
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
#ifdef BALLAST_WITH_CUDA
  // Ballast's own CUDA kernels need both our .cu objects and LibTorch's CUDA.
  const bool cuda_compiled = cuda.isBuilt();
#else
  const bool cuda_compiled = false;
#endif
  const bool cuda_available = cuda_compiled && cuda.hasCUDA();
  std::string cuda_detail;
  if (cuda_available)
    cuda_detail = std::to_string(cuda.deviceCount()) + " device(s)";
  else if (cuda_compiled)
    cuda_detail = "no CUDA device or driver on this machine";

  bool nccl_compiled = false;
  std::string nccl_detail;
#ifdef BALLAST_WITH_CUDA
  nccl_compiled = cuda_compiled;
  const uint64_t v = torch::cuda::nccl::version();
  // LibTorch packs the version as major << 32 | minor << 16 | patch.
  nccl_detail = "NCCL " + std::to_string(v >> 32) + "." + std::to_string((v >> 16) & 0xffff) + "." +
                std::to_string(v & 0xffff);
#endif
  std::ostringstream out;
  out << "LibTorch " << BALLAST_TORCH_VERSION << "\n"
      << "CUDA: " << Describe(cuda_compiled, cuda_available, cuda_detail) << "\n"
      << "NCCL: " << Describe(nccl_compiled, nccl_compiled && cuda_available, nccl_detail);
  return out.str();
}

VisibleDevices ProbeDevices() {
  VisibleDevices found;
  const at::CUDAHooksInterface& cuda = at::detail::getCUDAHooks();
#ifdef BALLAST_WITH_CUDA
  found.cuda_built = cuda.isBuilt();
#endif
  // hasCUDA() loads the driver; a machine without one answers false.
  if (found.cuda_built && cuda.hasCUDA()) found.cuda_devices = cuda.deviceCount();
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    found.cuda_visible_devices = visible;
  }
  return found;
}

absl::StatusOr<c10::Device> ChooseDevice(const std::string& device, const VisibleDevices& found) {
  const bool gpu = found.cuda_built && found.cuda_devices > 0;
  if (device == "cpu" || (device == "auto" && !gpu)) return c10::Device(c10::kCPU);
  if (device == "auto" || (device == "cuda" && gpu)) return c10::Device(c10::kCUDA, 0);
  if (device != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("device: '", device, "'; allowed auto, cpu or cuda"));
  }
  std::string why;
  if (!found.cuda_built) {
    why = "this ballast-train was built without CUDA (configure with BALLAST_CUDA=ON)";
  } else if (found.cuda_visible_devices && found.cuda_visible_devices->empty()) {
    why =
        "CUDA_VISIBLE_DEVICES is empty, so no GPU is visible (a worker sets it so for a CPU slot)";
  } else {
    why =
        absl::StrCat("the CUDA driver reports no device",
                     found.cuda_visible_devices
                         ? absl::StrCat(" among CUDA_VISIBLE_DEVICES=", *found.cuda_visible_devices)
                         : " (CUDA_VISIBLE_DEVICES is unset; is there a GPU and its driver?)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: cuda, but this rank has no usable GPU: ", why,
                   "; use device: auto or cpu to train on the CPU"));
}

}  // namespace ballast::train
