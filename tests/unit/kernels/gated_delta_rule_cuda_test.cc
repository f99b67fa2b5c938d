// GPU tests of gated_delta_rule and causal_conv1d_silu on CUDA (today the
// op-by-op path; a CUDA kernel would be held to the same test): each is
// compared with the CPU kernel on the same inputs, outputs and every
// gradient. Each skips without a device.
//
// Tolerance, relative (Frobenius): fp32 on both sides in different orders,
// through a triangular solve per chunk and a state carried over a few chunks:
// 1e-5, as the CPU tests hold the op-by-op path to the kernel; bf16 inputs
// give bf16 outputs rounded once on each side from fp32 values that differ by
// that much: 1e-2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/gated_delta_rule.h"
#include "tests/unit/kernels/gated_delta_rule_reference.h"

namespace ballast::kernels {
namespace {

using gdr_reference::Inputs;
using gdr_reference::RelativeError;

class GatedDeltaRuleCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    torch::manual_seed(31);
  }
};

// out, final_state and the gradients of q, k, v, g, beta and initial_state
// of sum(out * d_out) + sum(final_state * d_final), on the CPU.
std::vector<at::Tensor> RunGdr(const Inputs& in, const at::Tensor& d_out, const at::Tensor& d_final,
                               const torch::Device& device) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : {in.q, in.k, in.v, in.g, in.beta, in.initial_state})
    leaves.push_back(t.detach().to(device).clone().requires_grad_(true));
  const GatedDeltaRuleOutput o = gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3],
                                                  leaves[4], in.cu_seqlens, leaves[5], in.scale);
  ((o.out.to(torch::kFloat) * d_out.to(device)).sum() + (o.final_state * d_final.to(device)).sum())
      .backward();
  std::vector<at::Tensor> results = {o.out.detach().cpu(), o.final_state.detach().cpu()};
  for (const at::Tensor& leaf : leaves) results.push_back(leaf.grad().cpu());
  return results;
}

TEST_F(GatedDeltaRuleCuda, MatchesCpuKernel) {
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    const Inputs in = gdr_reference::RandomInputs({100, 1, 64, 200}, 2, 4, 128, 128,
                                                  /*with_state=*/true, dtype);
    const at::Tensor d_out = torch::randn({in.v.size(0), 4, 128});
    const at::Tensor d_final = torch::randn({4, 4, 128, 128});
    const std::vector<at::Tensor> cpu = RunGdr(in, d_out, d_final, torch::kCPU);
    const std::vector<at::Tensor> gpu = RunGdr(in, d_out, d_final, torch::kCUDA);
    const double tolerance = dtype == torch::kFloat ? 1e-5 : 1e-2;
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(gpu[i].scalar_type(), cpu[i].scalar_type()) << "result " << i;
      EXPECT_LT(RelativeError(gpu[i], cpu[i]), tolerance) << "result " << i << ", " << dtype;
    }
  }
}

TEST_F(GatedDeltaRuleCuda, ConvMatchesCpuKernel) {
  const at::Tensor cu = gdr_reference::CuSeqlens({3, 100, 1, 60});
  const at::Tensor x = torch::randn({164, 96}), w = torch::randn({96, 4});
  const at::Tensor window = torch::randn({4, 96, 3}), dy = torch::randn({164, 96});
  std::vector<std::vector<at::Tensor>> results;
  for (const torch::Device device : {torch::Device(torch::kCPU), torch::Device(torch::kCUDA)}) {
    std::vector<at::Tensor> leaves;
    for (const at::Tensor& t : {x, w, window})
      leaves.push_back(t.to(device).clone().requires_grad_(true));
    const at::Tensor y = causal_conv1d_silu(leaves[0], leaves[1], cu, leaves[2]);
    (y * dy.to(device)).sum().backward();
    results.push_back(
        {y.detach().cpu(), leaves[0].grad().cpu(), leaves[1].grad().cpu(), leaves[2].grad().cpu()});
  }
  for (size_t i = 0; i < results[0].size(); ++i)
    EXPECT_LT(RelativeError(results[1][i], results[0][i]), 1e-5) << "result " << i;
}

}  // namespace
}  // namespace ballast::kernels
