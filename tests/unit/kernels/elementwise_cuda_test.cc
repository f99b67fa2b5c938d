// GPU tests of the ATen-backed CUDA paths of rms_norm, swiglu, apply_rope
// and add_lora_update: each is compared with the CPU path on the same
// inputs, forward and backward. Each skips without a device.
//
// Tolerances, max |cuda - cpu| / max(max |cpu|, 1): fp32 computes the same
// formula in a different order and with different fused ops, a few fp32
// ulps of values ~1 (1e-5 leaves margin); bf16 results are rounded once to
// bf16 on both sides from fp32 values that differ by that much, so they may
// land one bf16 rounding apart (2^-8).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/lora_update.h"
#include "kernels/rms_norm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace ballast::kernels {
namespace {

class ElementwiseCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
    torch::manual_seed(31);
  }
};

double Tolerance(torch::Dtype dtype) { return dtype == torch::kFloat ? 1e-5 : 1.0 / 256; }

double RelativeError(const at::Tensor& actual, const at::Tensor& expected) {
  const auto a = actual.to(torch::kDouble).cpu();
  const auto e = expected.to(torch::kDouble).cpu();
  return (a - e).abs().max().item<double>() / std::max(e.abs().max().item<double>(), 1.0);
}

// Runs fn on leaf copies of inputs on `device`, backpropagates grad_out and
// returns {output, input gradients...} on the CPU.
std::vector<at::Tensor> Run(const std::function<at::Tensor(std::vector<at::Tensor>&)>& fn,
                            const std::vector<at::Tensor>& inputs, const at::Tensor& grad_out,
                            const torch::Device& device) {
  std::vector<at::Tensor> leaves;
  for (const auto& x : inputs) leaves.push_back(x.detach().to(device).clone().requires_grad_());
  const at::Tensor out = fn(leaves);
  out.backward(grad_out.to(device).to(out.scalar_type()));
  std::vector<at::Tensor> results = {out.detach().cpu()};
  for (const auto& l : leaves) results.push_back(l.grad().cpu());
  return results;
}

void ExpectCudaMatchesCpu(const std::function<at::Tensor(std::vector<at::Tensor>&)>& fn,
                          const std::vector<at::Tensor>& inputs, const at::Tensor& grad_out,
                          torch::Dtype dtype, const std::string& what) {
  const auto cpu = Run(fn, inputs, grad_out, torch::kCPU);
  const auto gpu = Run(fn, inputs, grad_out, torch::kCUDA);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_EQ(gpu[i].scalar_type(), cpu[i].scalar_type()) << what << " result " << i;
    EXPECT_LE(RelativeError(gpu[i], cpu[i]), Tolerance(dtype)) << what << " result " << i;
  }
}

TEST_F(ElementwiseCuda, RmsNormMatchesCpu) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = torch::randn({37, 4, 64}).to(dtype);
    const auto w = (1 + 0.1 * torch::randn({64})).to(dtype);
    ExpectCudaMatchesCpu([](auto& in) { return rms_norm(in[0], in[1], 1e-6); }, {x, w},
                         torch::randn({37, 4, 64}), dtype,
                         std::string("rms_norm ") + c10::toString(dtype));
  }
}

TEST_F(ElementwiseCuda, SwiGluMatchesCpu) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto gate_up = torch::randn({53, 96}).to(dtype);
    ExpectCudaMatchesCpu([](auto& in) { return swiglu(in[0]); }, {gate_up}, torch::randn({53, 48}),
                         dtype, std::string("swiglu ") + c10::toString(dtype));
  }
}

TEST_F(ElementwiseCuda, RopeMatchesCpu) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto x = torch::randn({29, 3, 32}).to(dtype);
    const auto angles = torch::rand({29, 16}) * 100;
    const auto emb = torch::cat({angles, angles}, 1);
    const auto cos = emb.cos().to(dtype);
    const auto sin = emb.sin().to(dtype);
    ExpectCudaMatchesCpu(
        [&](auto& in) { return apply_rope(in[0], cos.to(in[0].device()), sin.to(in[0].device())); },
        {x}, torch::randn({29, 3, 32}), dtype, std::string("rope ") + c10::toString(dtype));
  }
}

TEST_F(ElementwiseCuda, LoraUpdateMatchesCpu) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto y = torch::randn({40, 24}).to(dtype);
    const auto down = torch::randn({40, 12}).to(dtype);
    const auto up_a = torch::randn({16, 8}).to(dtype);
    const auto up_b = torch::randn({8, 4}).to(dtype);
    ExpectCudaMatchesCpu(
        [](auto& in) {
          // y is a leaf; the update is in place, so it runs on a copy.
          return add_lora_update(in[0] * 1, in[1], {in[2], in[3]}, {0, 16}, 0.5);
        },
        {y, down, up_a, up_b}, torch::randn({40, 24}), dtype,
        std::string("lora_update ") + c10::toString(dtype));
  }
}

TEST_F(ElementwiseCuda, GroupedLoraUpdateMatchesCpu) {
  // 4 experts of 8, 0, 22 and 10 rows; widths that ATen's grouped GEMM takes.
  const auto offsets = torch::tensor({8, 8, 30, 40}, torch::kInt);
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto y = torch::randn({40, 32}).to(dtype);
    const auto down = torch::randn({40, 16}).to(dtype);
    const auto up_gate = torch::randn({4, 16, 8}).to(dtype);
    const auto up_up = torch::randn({4, 16, 8}).to(dtype);
    ExpectCudaMatchesCpu(
        [&](auto& in) {
          return add_grouped_lora_update(in[0] * 1, in[1], {in[2], in[3]}, {0, 16},
                                         offsets.to(in[0].device()), 0.5);
        },
        {y, down, up_gate, up_up}, torch::randn({40, 32}), dtype,
        std::string("grouped lora_update ") + c10::toString(dtype));
  }
}

}  // namespace
}  // namespace ballast::kernels
