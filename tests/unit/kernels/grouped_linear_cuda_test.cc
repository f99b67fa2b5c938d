// GPU tests of grouped_linear (ATen's grouped GEMM) and SortByExpert on CUDA,
// against the CPU kernel on the same inputs: the output and both gradients,
// with empty experts among the groups. Each skips without a device.
//
// Tolerance, relative (Frobenius): bf16 results rounded once to bf16 on each
// side from fp32 sums in different orders: 1e-2. fp32 runs at::mm per expert
// on the GPU (TF32 off by default): 1e-5.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "kernels/expert_order.h"
#include "kernels/grouped_linear.h"
#include "tests/unit/kernels/grouped_linear_reference.h"

namespace ballast::kernels {
namespace {

using grouped_linear_reference::Offsets;
using grouped_linear_reference::ProductsOf;
using grouped_linear_reference::RelativeError;
using grouped_linear_reference::RunKernel;

class GroupedLinearCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    torch::manual_seed(32);
  }
};

TEST_F(GroupedLinearCuda, MatchesCpuKernel) {
  // Qwen3-30B-A3B's widths at a few experts, one of them empty, one past a
  // 256-row tile.
  const std::vector<int64_t> counts = {100, 0, 700, 37, 3, 0, 250, 1};
  int64_t rows = 0;
  for (int64_t c : counts) rows += c;
  const int64_t experts = static_cast<int64_t>(counts.size()), in = 2048, out = 768;
  for (at::ScalarType dtype : {torch::kBFloat16, torch::kFloat}) {
    const at::Tensor x = torch::randn({rows, in}).to(dtype);
    const at::Tensor w = (torch::randn({experts, out, in}) / 45).to(dtype);
    const at::Tensor dy = torch::randn({rows, out}).to(dtype);
    const ProductsOf cpu = RunKernel(x, w, Offsets(counts), dy);
    const ProductsOf gpu = RunKernel(x.cuda(), w.cuda(), Offsets(counts).cuda(), dy.cuda());
    const double tolerance = dtype == torch::kFloat ? 1e-5 : 1e-2;
    EXPECT_EQ(gpu.y.scalar_type(), dtype);
    EXPECT_LT(RelativeError(gpu.y, cpu.y), tolerance) << "y, " << dtype;
    EXPECT_LT(RelativeError(gpu.d_x, cpu.d_x), tolerance) << "d_x, " << dtype;
    EXPECT_LT(RelativeError(gpu.d_w, cpu.d_w), tolerance) << "d_w, " << dtype;
    EXPECT_EQ(gpu.d_w[1].abs().max().item<double>(), 0.0) << "empty expert, " << dtype;
    EXPECT_EQ(gpu.d_w[5].abs().max().item<double>(), 0.0) << "empty expert, " << dtype;
  }
}

TEST_F(GroupedLinearCuda, UnalignedWidthsAreRefusedByName) {
  const at::Tensor x = torch::randn({4, 12}, torch::kCUDA).to(torch::kBFloat16);
  const at::Tensor w = torch::randn({2, 8, 12}, torch::kCUDA).to(torch::kBFloat16);
  EXPECT_THROW(
      {
        try {
          grouped_linear(x, w, Offsets({1, 3}).cuda());
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("multiples of 8"), std::string::npos) << e.what();
          throw;
        }
      },
      c10::Error);
}

TEST_F(GroupedLinearCuda, SortByExpertMatchesCpu) {
  const at::Tensor selected = std::get<1>(torch::rand({1000, 64}).topk(8, 1));
  const ExpertOrder cpu = SortByExpert(selected, 64);
  const ExpertOrder gpu = SortByExpert(selected.cuda(), 64);
  EXPECT_TRUE(gpu.offsets.is_cuda());
  EXPECT_TRUE(torch::equal(gpu.slot.cpu(), cpu.slot));
  EXPECT_TRUE(torch::equal(gpu.token.cpu(), cpu.token));
  EXPECT_TRUE(torch::equal(gpu.counts.cpu(), cpu.counts));
  EXPECT_TRUE(torch::equal(gpu.offsets.cpu(), cpu.offsets));
}

}  // namespace
}  // namespace ballast::kernels
