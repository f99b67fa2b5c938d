// grouped_gemm_cuda_bench: the MoE experts' grouped products on CUDA
// (kernels::grouped_linear, ATen's CUTLASS grouped GEMM) against dense at::mm
// of exactly the same FLOPs (every routed row through one weight), measured in
// the same run. One row per shape:
//   grouped_gemm_cuda/fwd+bwd T=16384 E=128 top-8 H=2048 I=768 bf16: 0.9x dense (...)
//
// The six products of both projections (gate_up (E, 2I, H) and down (E, H, I)):
// forward, input gradient and weight gradient of each, FLOPs 3 x 2 rows x
// (2I H + I H). Routing is uniform at random, so experts get rows/E rows on
// average, unevenly. Time is the median of 5 runs, each synchronised,
// after one warm-up run.
#include <ATen/ATen.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/gpu/median_seconds.h"
#include "kernels/expert_order.h"
#include "kernels/grouped_linear.h"

namespace {

using ballast::bench::MedianSeconds;

void Row(int64_t tokens, int64_t experts, int64_t top_k, int64_t hidden, int64_t inter) {
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  const int64_t rows = tokens * top_k;
  const at::Tensor selected =
      std::get<1>(torch::rand({tokens, experts}, torch::kCUDA).topk(top_k, 1));
  const at::Tensor offsets = ballast::kernels::SortByExpert(selected, experts).offsets;
  const at::Tensor x = torch::randn({rows, hidden}, bf16).requires_grad_(true);
  const at::Tensor act = torch::randn({rows, inter}, bf16).requires_grad_(true);
  const at::Tensor gate_up =
      (torch::randn({experts, 2 * inter, hidden}, bf16) * 0.02).requires_grad_(true);
  const at::Tensor down =
      (torch::randn({experts, hidden, inter}, bf16) * 0.02).requires_grad_(true);
  const at::Tensor d_gu = torch::randn({rows, 2 * inter}, bf16);
  const at::Tensor d_y = torch::randn({rows, hidden}, bf16);
  const double grouped = MedianSeconds([&] {
    ballast::kernels::grouped_linear(x, gate_up, offsets).backward(d_gu);
    ballast::kernels::grouped_linear(act, down, offsets).backward(d_y);
    for (const at::Tensor& t : {x, act, gate_up, down}) t.mutable_grad().reset();
  });
  const at::Tensor w1 = gate_up[0].detach(), w2 = down[0].detach();
  const at::Tensor xd = x.detach(), ad = act.detach();
  const double dense = MedianSeconds([&] {
    at::mm(xd, w1.t()), at::mm(d_gu, w1), at::mm(d_gu.t(), xd);
    at::mm(ad, w2.t()), at::mm(d_y, w2), at::mm(d_y.t(), ad);
  });
  const double flops = 3.0 * 2.0 * rows * 3.0 * hidden * inter;
  std::printf(
      "grouped_gemm_cuda/fwd+bwd T=%lld E=%lld top-%lld H=%lld I=%lld bf16: %.2fx dense rate "
      "(%.0f vs %.0f TFLOP/s; %.2f vs %.2f ms)\n",
      static_cast<long long>(tokens), static_cast<long long>(experts),
      static_cast<long long>(top_k), static_cast<long long>(hidden), static_cast<long long>(inter),
      dense / grouped, flops / grouped / 1e12, flops / dense / 1e12, grouped * 1e3, dense * 1e3);
  std::fflush(stdout);
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("grouped_gemm_cuda: no CUDA device, nothing measured\n");
    return 0;
  }
  torch::manual_seed(0);
  Row(16384, 128, 8, 2048, 768);  // Qwen3-30B-A3B / SDAR-30B-A3B experts
  Row(4096, 64, 8, 1024, 768);    // the CPU benchmark's shape (bench/moe_layer.py)
  return 0;
}
