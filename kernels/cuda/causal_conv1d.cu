// The causal conv1d + SiLU on CUDA: the passes of kernels/cuda/
// causal_conv1d_blocks.h launched as kernels (kernels/cuda/
// block_program.cuh) on the current stream of the inputs' device.
#include <c10/cuda/CUDAGuard.h>

#include "kernels/cuda/block_program.cuh"
#include "kernels/cuda/causal_conv1d_blocks.h"
#include "kernels/cuda/causal_conv1d_cuda.h"

namespace ballast::kernels {

bool causal_conv1d_cuda_supports(const at::Device& device) { return device.is_cuda(); }

at::Tensor causal_conv1d_silu_cuda_forward(const at::Tensor& x, const at::Tensor& weight,
                                           const at::Tensor& cu_seqlens,
                                           const at::Tensor& initial_window) {
  c10::cuda::CUDAGuard guard(x.device());
  return conv_blocks::ForwardPass(block_program::CudaLaunch{"causal_conv1d_silu"}, x, weight,
                                  cu_seqlens, initial_window);
}

CausalConv1dGrads causal_conv1d_silu_cuda_backward(const at::Tensor& x, const at::Tensor& weight,
                                                   const at::Tensor& cu_seqlens,
                                                   const at::Tensor& initial_window,
                                                   const at::Tensor& dy) {
  c10::cuda::CUDAGuard guard(x.device());
  return conv_blocks::BackwardPass(block_program::CudaLaunch{"causal_conv1d_silu backward"}, x,
                                   weight, cu_seqlens, initial_window, dy);
}

}  // namespace ballast::kernels
