#include "worker/train/rank/device_info.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <sstream>

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

}  // namespace ballast::train
