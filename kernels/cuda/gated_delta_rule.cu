// The Gated DeltaNet kernels on CUDA: the passes of kernels/cuda/
// gated_delta_rule_blocks.h launched as kernels (kernels/cuda/
// block_program.cuh) on the current stream of the inputs' device.
#include <c10/cuda/CUDAGuard.h>

#include "kernels/cuda/block_program.cuh"
#include "kernels/cuda/gated_delta_rule_blocks.h"
#include "kernels/cuda/gated_delta_rule_cuda.h"

namespace ballast::kernels {

bool gated_delta_rule_cuda_supports(int64_t dk, const at::Device& device) {
  if (!device.is_cuda()) return false;
  c10::cuda::CUDAGuard guard(device);
  return gdr_blocks::MaxSmemFloats(dk) * static_cast<int64_t>(sizeof(float)) <=
         block_program::DeviceSmemOptin();
}

GdrForward gated_delta_rule_cuda_forward(const at::Tensor& q, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& g,
                                         const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                         const at::Tensor& initial_state, double scale,
                                         double l2norm_eps) {
  c10::cuda::CUDAGuard guard(q.device());
  return gdr_blocks::ForwardPass(block_program::CudaLaunch{"gated_delta_rule"}, q, k, v, g, beta,
                                 cu_seqlens, initial_state, scale, l2norm_eps);
}

GdrGrads gated_delta_rule_cuda_backward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& g,
                                        const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                        const at::Tensor& chunk_states, const at::Tensor& d_out,
                                        const at::Tensor& d_final, double scale,
                                        double l2norm_eps) {
  c10::cuda::CUDAGuard guard(q.device());
  return gdr_blocks::BackwardPass(block_program::CudaLaunch{"gated_delta_rule backward"}, q, k, v,
                                  g, beta, cu_seqlens, chunk_states, d_out, d_final, scale,
                                  l2norm_eps);
}

}  // namespace ballast::kernels
