// Built in place of kernels/cuda/*.cu when CUDA is off (BALLAST_CUDA=OFF, or
// AUTO without a toolkit): a CUDA tensor reaching a kernel gets a clear error.
#include <c10/util/Exception.h>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/causal_conv1d_cuda.h"
#include "kernels/cuda/gated_delta_rule_cuda.h"
#include "kernels/cuda/grad_norm_cuda.h"
#include "kernels/cuda/linear_cross_entropy_cuda.h"

namespace ballast::kernels {

GradNormResult grad_norm_cuda(const std::vector<at::Tensor>&, bool) {
  TORCH_CHECK(false, "grad_norm: this build has no CUDA kernels (configure with BALLAST_CUDA=ON)");
}

DeviceCaps attention_device_caps(const at::Device&) {
  TORCH_CHECK(false,
              "attention: CUDA kernel not available in this build (configure with "
              "BALLAST_CUDA=ON)");
}

AttentionCudaForward attention_cuda_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            MaskPlan&, TileShape, double) {
  TORCH_CHECK(false,
              "attention: CUDA kernel not available in this build (configure with "
              "BALLAST_CUDA=ON)");
}

AttentionCudaGrads attention_cuda_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           MaskPlan&, TileShape, TileShape, double) {
  TORCH_CHECK(false,
              "attention: CUDA kernel not available in this build (configure with "
              "BALLAST_CUDA=ON)");
}

LceForward linear_cross_entropy_cuda_forward(const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, const at::Tensor&,
                                             const at::Tensor&, double) {
  TORCH_CHECK(false,
              "linear_cross_entropy: CUDA kernel not available in this build; move the tensors "
              "to CPU");
}

LceGrads linear_cross_entropy_cuda_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                            const at::Tensor&, double, bool, bool) {
  TORCH_CHECK(false,
              "linear_cross_entropy: CUDA kernel not available in this build; move the tensors "
              "to CPU");
}

// False: gated_delta_rule() takes its op-by-op path on a CUDA device.
bool gated_delta_rule_cuda_supports(int64_t, const at::Device&) { return false; }

GdrForward gated_delta_rule_cuda_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, double, double) {
  TORCH_CHECK(false, "gated_delta_rule: CUDA kernel not available in this build");
}

GdrGrads gated_delta_rule_cuda_backward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        double, double) {
  TORCH_CHECK(false, "gated_delta_rule: CUDA kernel not available in this build");
}

// False: causal_conv1d_silu() takes its op-by-op path on a CUDA device.
bool causal_conv1d_cuda_supports(const at::Device&) { return false; }

at::Tensor causal_conv1d_silu_cuda_forward(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const at::Tensor&) {
  TORCH_CHECK(false, "causal_conv1d_silu: CUDA kernel not available in this build");
}

CausalConv1dGrads causal_conv1d_silu_cuda_backward(const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&) {
  TORCH_CHECK(false, "causal_conv1d_silu: CUDA kernel not available in this build");
}

}  // namespace ballast::kernels
