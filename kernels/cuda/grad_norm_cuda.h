// CUDA implementation of kernels/grad_norm.h; callers go through grad_norm().
#ifndef BALLAST_KERNELS_CUDA_GRAD_NORM_CUDA_H_
#define BALLAST_KERNELS_CUDA_GRAD_NORM_CUDA_H_

#include "kernels/grad_norm.h"

namespace ballast::kernels {

// Same contract as grad_norm(), for tensors on one CUDA device. In a build
// without CUDA it throws, naming the missing backend.
GradNormResult grad_norm_cuda(const std::vector<at::Tensor>& tensors, bool locate_nonfinite);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_GRAD_NORM_CUDA_H_
