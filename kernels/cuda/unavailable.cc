// Built in place of kernels/cuda/*.cu when CUDA is off (BALLAST_CUDA=OFF, or
// AUTO without a toolkit): a CUDA tensor reaching a kernel gets a clear error.
#include <c10/util/Exception.h>

#include "kernels/cuda/grad_norm_cuda.h"

namespace ballast::kernels {

GradNormResult grad_norm_cuda(const std::vector<at::Tensor>&) {
  TORCH_CHECK(false, "grad_norm: this build has no CUDA kernels (configure with BALLAST_CUDA=ON)");
}

}  // namespace ballast::kernels
