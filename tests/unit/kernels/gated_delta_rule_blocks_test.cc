// The CUDA kernels' block programs (kernels/cuda/gated_delta_rule_blocks.h,
// causal_conv1d_blocks.h) run on the CPU, one block after another
// (block_program::HostLaunch), against the CPU kernels: the same code as on
// the GPU, its indexing, chunk tables, tiles over Dv and document
// boundaries, checked in every build. Most cases run a block on one thread;
// one runs each block on 3 threads with real barriers, which
// exercises the division of work among threads and the block sums. A
// missing barrier shows there only if the threads race; that, and the
// launches, are left to the GatedDeltaRuleCuda tests on a GPU.
//
// Tolerance, relative (Frobenius): fp32 on both sides, in other orders
// (forward substitution against the CPU's explicit inverse, sums by element
// against the CPU's vectors): 1e-5, as the op-by-op path is held to the CPU
// kernel, up to 32 x 32 heads and growing with the root of Dk x Dv past it.
// bf16 results are rounded once on each side from fp32 values that
// differ by that much: 1e-2.
#include "kernels/cuda/gated_delta_rule_blocks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/causal_conv1d_cpu.h"
#include "kernels/cpu/gated_delta_rule_cpu.h"
#include "kernels/cuda/causal_conv1d_blocks.h"
#include "kernels/cuda/host_launch.h"
#include "tests/unit/kernels/gated_delta_rule_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using block_program::HostLaunch;
using gdr_reference::CuSeqlens;
using gdr_reference::Inputs;
using gdr_reference::kL2Eps;
using gdr_reference::RandomInputs;
using gdr_reference::RelativeError;

struct Case {
  std::vector<int64_t> lengths;
  int64_t hk, hv, dk, dv;
  bool with_state;
  at::ScalarType dtype = torch::kFloat;
};

std::string Describe(const Case& c) {
  std::string s = "lengths";
  for (int64_t l : c.lengths) s += " " + std::to_string(l);
  return s + ", Hk " + std::to_string(c.hk) + " Hv " + std::to_string(c.hv) + " Dk " +
         std::to_string(c.dk) + " Dv " + std::to_string(c.dv) +
         (c.with_state ? ", initial state" : "") + (c.dtype == torch::kBFloat16 ? ", bf16" : "");
}

// The block programs' forward and backward against the CPU kernel's, on the
// same inputs and upstream gradients: every output and gradient, and the
// per-chunk states the backward starts from.
void ExpectBlocksMatchCpuKernel(const Case& c, bool with_d_final = true,
                                HostLaunch launch = HostLaunch{}) {
  SCOPED_TRACE(Describe(c) + ", " + std::to_string(launch.threads) + " thread(s) a block");
  const Inputs in = RandomInputs(c.lengths, c.hk, c.hv, c.dk, c.dv, c.with_state, c.dtype);
  const int64_t tokens = in.q.size(0), docs = static_cast<int64_t>(c.lengths.size());
  const at::Tensor d_out = torch::randn({tokens, c.hv, c.dv}).to(c.dtype);
  const at::Tensor d_final = with_d_final ? torch::randn({docs, c.hv, c.dk, c.dv}) : at::Tensor();
  const GdrForward want = gated_delta_rule_cpu_forward(
      in.q, in.k, in.v, in.g, in.beta, in.cu_seqlens, in.initial_state, in.scale, kL2Eps);
  const GdrForward got = gdr_blocks::ForwardPass(launch, in.q, in.k, in.v, in.g, in.beta,
                                                 in.cu_seqlens, in.initial_state, in.scale, kL2Eps);
  // Two fp32 summation orders of reductions over Dk x Dv terms (d_g, d_beta)
  // differ by about sqrt(Dk x Dv) roundings: 1e-5 holds to 32 x 32, and
  // grows with the root past it (d_g at Qwen's 128 x 128 measured 1.01e-5).
  const double fp32_tolerance =
      1e-5 * std::max(1.0, std::sqrt(static_cast<double>(c.dk * c.dv)) / 32);
  const double tolerance = c.dtype == torch::kFloat ? fp32_tolerance : 1e-2;
  EXPECT_EQ(got.out.scalar_type(), c.dtype);
  EXPECT_LT(RelativeError(got.out, want.out), tolerance) << "out";
  EXPECT_LT(RelativeError(got.final_state, want.final_state), 1e-5) << "final_state";
  EXPECT_LT(RelativeError(got.chunk_states, want.chunk_states), 1e-5) << "chunk_states";
  const GdrGrads want_grads =
      gated_delta_rule_cpu_backward(in.q, in.k, in.v, in.g, in.beta, in.cu_seqlens,
                                    want.chunk_states, d_out, d_final, in.scale, kL2Eps);
  const GdrGrads got_grads =
      gdr_blocks::BackwardPass(launch, in.q, in.k, in.v, in.g, in.beta, in.cu_seqlens,
                               got.chunk_states, d_out, d_final, in.scale, kL2Eps);
  for (const auto& [name, g, w] : std::vector<std::tuple<std::string, at::Tensor, at::Tensor>>{
           {"d_q", got_grads.d_q, want_grads.d_q},
           {"d_k", got_grads.d_k, want_grads.d_k},
           {"d_v", got_grads.d_v, want_grads.d_v},
           {"d_g", got_grads.d_g, want_grads.d_g},
           {"d_beta", got_grads.d_beta, want_grads.d_beta},
           {"d_state", got_grads.d_state, want_grads.d_state}}) {
    EXPECT_EQ(g.scalar_type(), w.scalar_type()) << name;
    EXPECT_EQ(g.sizes(), w.sizes()) << name;
    EXPECT_LT(RelativeError(g, w), tolerance) << name;
  }
}

class GatedDeltaRuleBlocks : public SeededTest {};

// One document of 1, 63, 64 and 65 tokens (one chunk, a full one, one and a
// bit), Dk != Dv with Dv not a multiple of the 32-column tile, so that a
// transposed index or a tile edge shows.
TEST_F(GatedDeltaRuleBlocks, MatchCpuKernelAroundTheChunk) {
  SCOPED_TRACE(SeedTrace());
  for (int64_t length : {1, 63, 64, 65})
    ExpectBlocksMatchCpuKernel({{length}, 2, 4, 24, 40, /*with_state=*/true});
}

// Several documents (one empty, one of a single token) packed in a row,
// with and without initial states, and without a final-state gradient.
TEST_F(GatedDeltaRuleBlocks, MatchCpuKernelOnPackedDocuments) {
  SCOPED_TRACE(SeedTrace());
  for (bool with_state : {false, true})
    ExpectBlocksMatchCpuKernel({{100, 0, 1, 64, 130}, 1, 3, 16, 33, with_state});
  ExpectBlocksMatchCpuKernel({{70, 60}, 2, 2, 16, 16, /*with_state=*/true},
                             /*with_d_final=*/false);
}

// Each block run by 3 threads sharing its shared memory, with barriers: the
// bodies' loops split unevenly among threads (3 divides none of the sizes),
// and the block sum of <S0, dS_L> over the threads' shares. Small, since every
// barrier costs a wake-up of three host threads.
TEST_F(GatedDeltaRuleBlocks, MatchCpuKernelWithSeveralThreadsABlock) {
  SCOPED_TRACE(SeedTrace());
  ExpectBlocksMatchCpuKernel({{70, 0, 1, 64}, 1, 2, 24, 40, /*with_state=*/true},
                             /*with_d_final=*/true, HostLaunch{3});
}

// Qwen3.5's head dims (Dk = Dv = 128, four Dv tiles), and bf16 inputs.
TEST_F(GatedDeltaRuleBlocks, MatchCpuKernelAtQwenHeadDimsAndBf16) {
  SCOPED_TRACE(SeedTrace());
  ExpectBlocksMatchCpuKernel({{65, 3}, 1, 2, 128, 128, /*with_state=*/true});
  ExpectBlocksMatchCpuKernel({{70, 64}, 2, 4, 32, 32, /*with_state=*/true, torch::kBFloat16});
}

// 4097 tokens, 65 chunks carried by the recurrences; small heads so that one
// thread runs it in seconds.
TEST_F(GatedDeltaRuleBlocks, MatchCpuKernelOverManyChunks) {
  SCOPED_TRACE(SeedTrace());
  ExpectBlocksMatchCpuKernel({{4097}, 1, 2, 8, 8, /*with_state=*/true});
}

// q, k and v as strided views of one fused projection, as the model passes
// them: the same results as contiguous copies.
TEST_F(GatedDeltaRuleBlocks, ReadStridedViews) {
  SCOPED_TRACE(SeedTrace());
  const int64_t tokens = 90, hk = 1, hv = 2, dk = 16, dv = 8;
  const gdr_reference::FusedQkv f = gdr_reference::FusedProjection(tokens, hk, hv, dk, dv);
  const at::Tensor &q = f.q, &k = f.k, &v = f.v;
  ASSERT_FALSE(q.is_contiguous());
  const Inputs in = RandomInputs({tokens}, hk, hv, dk, dv, /*with_state=*/false);
  const GdrForward strided = gdr_blocks::ForwardPass(HostLaunch{}, q, k, v, in.g, in.beta,
                                                     in.cu_seqlens, at::Tensor(), 0.25, kL2Eps);
  const GdrForward copied =
      gdr_blocks::ForwardPass(HostLaunch{}, q.contiguous(), k.contiguous(), v.contiguous(), in.g,
                              in.beta, in.cu_seqlens, at::Tensor(), 0.25, kL2Eps);
  EXPECT_TRUE(torch::equal(strided.out, copied.out));
  EXPECT_TRUE(torch::equal(strided.final_state, copied.final_state));
}

// The shared memory each pass asks for at Dk = 128 fits an sm_80 block (163
// KiB), and at Dk = 256 an sm_90 block (227 KiB): the limits that
// gated_delta_rule_cuda_supports() tests on the device.
TEST(GatedDeltaRuleBlocksSmem, FitsTheDevicesItIsMeantFor) {
  EXPECT_LE(gdr_blocks::MaxSmemFloats(128) * 4, 163 * 1024);
  EXPECT_LE(gdr_blocks::MaxSmemFloats(256) * 4, 227 * 1024);
  EXPECT_GT(gdr_blocks::MaxSmemFloats(256) * 4, 163 * 1024);
}

class CausalConv1dBlocks : public SeededTest {};

// The conv's block programs against the CPU kernel: documents shorter than
// the window and an empty one, more channels than one block of threads (and
// not a multiple of it), with and without a window, fp32 and bf16. y and every
// gradient; the backward with 3 threads a block.
TEST_F(CausalConv1dBlocks, MatchCpuKernel) {
  SCOPED_TRACE(SeedTrace());
  const at::Tensor cu = CuSeqlens({3, 100, 0, 1, 70});
  const int64_t tokens = 174, channels = 300, taps = 4;
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool with_window : {false, true}) {
      SCOPED_TRACE(std::string(dtype == torch::kFloat ? "fp32" : "bf16") +
                   (with_window ? ", window" : ", no window"));
      const at::Tensor x = torch::randn({tokens, channels}).to(dtype);
      const at::Tensor w = torch::randn({channels, taps}).to(dtype);
      const at::Tensor window =
          with_window ? torch::randn({5, channels, taps - 1}).to(dtype) : at::Tensor();
      const at::Tensor dy = torch::randn({tokens, channels});
      const double tolerance = dtype == torch::kFloat ? 1e-6 : 1e-2;
      EXPECT_LT(RelativeError(conv_blocks::ForwardPass(HostLaunch{}, x, w, cu, window),
                              causal_conv1d_silu_cpu_forward(x, w, cu, window)),
                tolerance)
          << "y";
      const CausalConv1dGrads got = conv_blocks::BackwardPass(HostLaunch{3}, x, w, cu, window, dy);
      const CausalConv1dGrads want = causal_conv1d_silu_cpu_backward(x, w, cu, window, dy);
      EXPECT_LT(RelativeError(got.d_x, want.d_x), tolerance) << "d_x";
      EXPECT_LT(RelativeError(got.d_weight, want.d_weight), tolerance) << "d_weight";
      EXPECT_EQ(got.d_weight.scalar_type(), dtype);
      EXPECT_EQ(got.d_window.defined(), with_window);
      if (with_window) EXPECT_LT(RelativeError(got.d_window, want.d_window), tolerance);
    }
  }
}

}  // namespace
}  // namespace ballast::kernels
