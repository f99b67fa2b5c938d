// CUDA implementation of kernels/grouped_linear.h, on ATen's grouped GEMM
// (at::_grouped_mm): the forward product and the two of its backward, with the
// contracts of kernels/cpu/grouped_linear_cpu.h. grouped_linear() validates
// the arguments; these check only the alignment ATen's kernel needs.
//
// It is ATen calls only, so it builds without nvcc and runs wherever LibTorch
// has CUDA.
#ifndef BALLAST_KERNELS_CUDA_GROUPED_LINEAR_CUDA_H_
#define BALLAST_KERNELS_CUDA_GROUPED_LINEAR_CUDA_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

at::Tensor grouped_linear_cuda_forward(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& offsets);

at::Tensor grouped_linear_cuda_input_grad(const at::Tensor& d_y, const at::Tensor& weight,
                                          const at::Tensor& offsets);

at::Tensor grouped_linear_cuda_weight_grad(const at::Tensor& d_y, const at::Tensor& x,
                                           const at::Tensor& offsets);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CUDA_GROUPED_LINEAR_CUDA_H_
