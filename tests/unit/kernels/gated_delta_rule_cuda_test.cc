// GPU tests of gated_delta_rule and causal_conv1d_silu on CUDA: the CUDA
// kernels (kernels/cuda/gated_delta_rule_cuda.h, causal_conv1d_cuda.h) against
// the CPU kernels on the same inputs, outputs and every gradient (q, k, v, g,
// beta, initial_state, through out and through final_state). Each skips
// without a device. Their block programs are checked on the CPU in every
// build (gated_delta_rule_blocks_test.cc); what is left for these is what one
// thread cannot show: barriers, races, the launches themselves.
//
// Tolerance, relative (Frobenius): fp32 on both sides in different orders,
// through a triangular solve per chunk and a state carried over up to 65
// chunks: 1e-5, as the CPU tests hold the op-by-op path to the kernel; bf16
// inputs give bf16 outputs rounded once on each side from fp32 values that
// differ by that much: 1e-2.
#include "kernels/cuda/gated_delta_rule_cuda.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/cuda/causal_conv1d_cuda.h"
#include "kernels/gated_delta_rule.h"
#include "tests/unit/kernels/gated_delta_rule_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using gdr_reference::Inputs;
using gdr_reference::RelativeError;

class GatedDeltaRuleCuda : public SeededTest {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    SeededTest::SetUp();
  }
};

// out, final_state and the gradients of q, k, v, g, beta and initial_state
// of sum(out * d_out) + sum(final_state * d_final), on `device`, back on the
// CPU.
std::vector<at::Tensor> RunGdr(const Inputs& in, const at::Tensor& d_out, const at::Tensor& d_final,
                               const torch::Device& device) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : {in.q, in.k, in.v, in.g, in.beta, in.initial_state})
    leaves.push_back(t.defined() ? t.detach().to(device).clone().requires_grad_(true)
                                 : at::Tensor());
  const GatedDeltaRuleOutput o = gated_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3],
                                                  leaves[4], in.cu_seqlens, leaves[5], in.scale);
  ((o.out.to(torch::kFloat) * d_out.to(device)).sum() + (o.final_state * d_final.to(device)).sum())
      .backward();
  std::vector<at::Tensor> results = {o.out.detach().cpu(), o.final_state.detach().cpu()};
  for (const at::Tensor& leaf : leaves)
    if (leaf.defined()) results.push_back(leaf.grad().cpu());
  return results;
}

const char* const kResultNames[] = {"out", "final_state", "d_q",    "d_k",
                                    "d_v", "d_g",         "d_beta", "d_initial_state"};

// The CUDA kernel against the CPU kernel for one configuration.
void ExpectCudaMatchesCpu(const std::vector<int64_t>& lengths, int64_t hk, int64_t hv, int64_t dk,
                          int64_t dv, bool with_state, at::ScalarType dtype) {
  std::string what = "lengths";
  for (int64_t l : lengths) what += " " + std::to_string(l);
  SCOPED_TRACE(what + ", Dk " + std::to_string(dk) + (with_state ? ", initial state" : "") +
               (dtype == torch::kBFloat16 ? ", bf16" : ", fp32"));
  ASSERT_TRUE(gated_delta_rule_cuda_supports(dk, torch::Device(torch::kCUDA)))
      << "the CUDA kernel should serve Dk " << dk << " on this device";
  const Inputs in = gdr_reference::RandomInputs(lengths, hk, hv, dk, dv, with_state, dtype);
  const at::Tensor d_out = torch::randn({in.v.size(0), hv, dv});
  const at::Tensor d_final = torch::randn({static_cast<int64_t>(lengths.size()), hv, dk, dv});
  const std::vector<at::Tensor> cpu = RunGdr(in, d_out, d_final, torch::kCPU);
  const std::vector<at::Tensor> gpu = RunGdr(in, d_out, d_final, torch::kCUDA);
  ASSERT_EQ(gpu.size(), cpu.size());
  const double tolerance = dtype == torch::kFloat ? 1e-5 : 1e-2;
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].scalar_type(), cpu[i].scalar_type()) << kResultNames[i];
    EXPECT_EQ(gpu[i].sizes(), cpu[i].sizes()) << kResultNames[i];
    EXPECT_TRUE(gpu[i].isfinite().all().item<bool>()) << kResultNames[i];
    // A state's bf16 path is still fp32 (the state, its gradient, g and beta).
    EXPECT_LT(RelativeError(gpu[i], cpu[i]), tolerance) << kResultNames[i];
  }
}

// One document of 1, 63, 64, 65 and 4097 tokens (one chunk, a full one, one
// and a bit, 65 chunks), Qwen3.5's head dims and Hv = 2 Hk, fp32, with an
// initial state.
TEST_F(GatedDeltaRuleCuda, MatchesCpuKernelAroundTheChunk) {
  SCOPED_TRACE(SeedTrace());
  for (int64_t length : {1, 63, 64, 65, 4097})
    ExpectCudaMatchesCpu({length}, 2, 4, 128, 128, /*with_state=*/true, torch::kFloat);
}

// Several documents packed in a row (one empty, one of one token), with and
// without initial states, fp32 and bf16.
TEST_F(GatedDeltaRuleCuda, MatchesCpuKernelOnPackedDocuments) {
  SCOPED_TRACE(SeedTrace());
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16})
    for (bool with_state : {false, true})
      ExpectCudaMatchesCpu({100, 1, 64, 0, 200}, 2, 4, 128, 128, with_state, dtype);
}

// Head dims other than Qwen3.5's: Dk != Dv with Dv not a multiple of the
// 32-column tile, and Dk = 256 where the device has the shared memory (sm_90).
TEST_F(GatedDeltaRuleCuda, MatchesCpuKernelAtOtherHeadDims) {
  SCOPED_TRACE(SeedTrace());
  ExpectCudaMatchesCpu({70, 130}, 1, 3, 64, 40, /*with_state=*/true, torch::kFloat);
  if (gated_delta_rule_cuda_supports(256, torch::Device(torch::kCUDA)))
    ExpectCudaMatchesCpu({90, 40}, 1, 1, 256, 64, /*with_state=*/true, torch::kFloat);
}

// The kernel and a packed row: equal to each document run alone, to fp32
// rounding (the GPU chunks are the same either way, so this is bitwise in
// practice; 1e-6 leaves the launch order free).
TEST_F(GatedDeltaRuleCuda, PackedRowEqualsDocumentsAlone) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {100, 1, 64, 257};
  const Inputs packed = gdr_reference::RandomInputs(lengths, 2, 4, 128, 128, true);
  const int64_t tokens = packed.q.size(0);
  const at::Tensor d_out = torch::randn({tokens, 4, 128});
  const at::Tensor d_final = torch::randn({4, 4, 128, 128});
  const std::vector<at::Tensor> whole = RunGdr(packed, d_out, d_final, torch::kCUDA);
  int64_t begin = 0;
  for (size_t n = 0; n < lengths.size(); ++n) {
    const int64_t length = lengths[n];
    const Inputs alone = gdr_reference::DocumentAlone(packed, n, begin, length);
    const std::vector<at::Tensor> one =
        RunGdr(alone, d_out.narrow(0, begin, length), d_final.narrow(0, n, 1), torch::kCUDA);
    SCOPED_TRACE("document " + std::to_string(n));
    for (size_t i = 0; i < one.size(); ++i) {
      // Per-token results are rows [begin, begin + length); states are row n.
      const bool per_token = i != 1 && i != 7;
      const at::Tensor part =
          per_token ? whole[i].narrow(0, begin, length) : whole[i].narrow(0, n, 1);
      EXPECT_LT(RelativeError(part, one[i]), 1e-6) << kResultNames[i];
    }
    begin += length;
  }
}

// Each output element is summed in a fixed order by one thread: two runs give
// the same bits.
TEST_F(GatedDeltaRuleCuda, SameBitsTwice) {
  SCOPED_TRACE(SeedTrace());
  const Inputs in = gdr_reference::RandomInputs({300, 65}, 2, 4, 128, 128, true);
  const at::Tensor d_out = torch::randn({365, 4, 128});
  const at::Tensor d_final = torch::randn({2, 4, 128, 128});
  const std::vector<at::Tensor> first = RunGdr(in, d_out, d_final, torch::kCUDA);
  const std::vector<at::Tensor> second = RunGdr(in, d_out, d_final, torch::kCUDA);
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_TRUE(torch::equal(first[i], second[i])) << kResultNames[i];
}

// The conv kernel against the CPU kernel: documents shorter than the window
// and an empty one, more channels than a block of threads, with and without
// windows, fp32 (1e-6: one product of K terms and a sigmoid) and bf16 (1e-2).
TEST_F(GatedDeltaRuleCuda, ConvMatchesCpuKernel) {
  SCOPED_TRACE(SeedTrace());
  ASSERT_TRUE(causal_conv1d_cuda_supports(torch::Device(torch::kCUDA)));
  const at::Tensor cu = gdr_reference::CuSeqlens({3, 100, 0, 1, 60, 4097});
  const int64_t tokens = 4261, channels = 300;
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool with_window : {false, true}) {
      SCOPED_TRACE(std::string(dtype == torch::kFloat ? "fp32" : "bf16") +
                   (with_window ? ", window" : ", no window"));
      const at::Tensor x = torch::randn({tokens, channels}).to(dtype);
      const at::Tensor w = torch::randn({channels, 4}).to(dtype);
      const at::Tensor window =
          with_window ? torch::randn({6, channels, 3}).to(dtype) : at::Tensor();
      const at::Tensor dy = torch::randn({tokens, channels});
      std::vector<std::vector<at::Tensor>> results;
      for (const torch::Device device : {torch::Device(torch::kCPU), torch::Device(torch::kCUDA)}) {
        std::vector<at::Tensor> leaves;
        for (const at::Tensor& t : {x, w, window})
          leaves.push_back(t.defined() ? t.to(device).clone().requires_grad_(true) : at::Tensor());
        const at::Tensor y = causal_conv1d_silu(leaves[0], leaves[1], cu, leaves[2]);
        (y.to(torch::kFloat) * dy.to(device)).sum().backward();
        std::vector<at::Tensor> r = {y.detach().cpu(), leaves[0].grad().cpu(),
                                     leaves[1].grad().cpu()};
        if (with_window) r.push_back(leaves[2].grad().cpu());
        results.push_back(r);
      }
      const double tolerance = dtype == torch::kFloat ? 1e-6 : 1e-2;
      const char* names[] = {"y", "d_x", "d_weight", "d_window"};
      for (size_t i = 0; i < results[0].size(); ++i) {
        EXPECT_EQ(results[1][i].scalar_type(), results[0][i].scalar_type()) << names[i];
        EXPECT_LT(RelativeError(results[1][i], results[0][i]), tolerance) << names[i];
      }
    }
  }
}

}  // namespace
}  // namespace ballast::kernels
