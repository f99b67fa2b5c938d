// attention_cuda_bench: forward and forward+backward throughput of the CUDA
// attention kernels against torch SDPA's flash backend, measured in the same
// run on the same inputs. One row per shape:
//   attention_cuda/fwd+bwd T=65536 D=128 vs sdpa_flash: 0.83x TFLOP/s (...)
//
// A second row per shape times the kernel with the tile variants of a
// 99 KiB card (BALLAST_ATTENTION_SMEM_LIMIT), for sm_86 / 89 / 120.
//
// Shapes: T = 8k, 64k, 128k tokens in one causal document, D = 128 and 256,
// bf16, Hq = Hkv; heads shrink as T grows so that each shape runs a fraction
// of a second. FLOPs are counted the FlashAttention way for a causal mask:
// forward 2 T^2 D H (two products over the lower triangle), backward 2.5x
// that, the same count for both kernels. Time is the median of 5 runs,
// each synchronised, after one warm-up run.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "bench/gpu/median_seconds.h"
#include "kernels/attention.h"

namespace {

using ballast::bench::MedianSeconds;

// Only SDPA's flash backend may run while this lives.
class OnlyFlashSdpa {
 public:
  OnlyFlashSdpa() {
    auto& ctx = at::globalContext();
    flash_ = ctx.userEnabledFlashSDP();
    mem_ = ctx.userEnabledMemEfficientSDP();
    math_ = ctx.userEnabledMathSDP();
    cudnn_ = ctx.userEnabledCuDNNSDP();
    ctx.setSDPUseFlash(true);
    ctx.setSDPUseMemEfficient(false);
    ctx.setSDPUseMath(false);
    ctx.setSDPUseCuDNN(false);
  }
  ~OnlyFlashSdpa() {
    auto& ctx = at::globalContext();
    ctx.setSDPUseFlash(flash_);
    ctx.setSDPUseMemEfficient(mem_);
    ctx.setSDPUseMath(math_);
    ctx.setSDPUseCuDNN(cudnn_);
  }

 private:
  bool flash_, mem_, math_, cudnn_;
};

struct Timing {
  double fwd = 0;
  double fwd_bwd = 0;
};

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("attention_cuda_bench: no CUDA device, skipped\n");
    return 0;
  }
  using ballast::kernels::AttentionMask;
  using ballast::kernels::MaskKind;
  struct Shape {
    int64_t tokens, head_dim, heads;
  };
  const std::vector<Shape> shapes = {{8192, 128, 16}, {8192, 256, 16},  {65536, 128, 2},
                                     {65536, 256, 2}, {131072, 128, 1}, {131072, 256, 1}};
  torch::manual_seed(0);
  for (const Shape& s : shapes) {
    const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    const auto q = torch::randn({s.tokens, s.heads, s.head_dim}, opts).requires_grad_(true);
    const auto k = torch::randn({s.tokens, s.heads, s.head_dim}, opts).requires_grad_(true);
    const auto v = torch::randn({s.tokens, s.heads, s.head_dim}, opts).requires_grad_(true);
    const auto grad = torch::randn({s.tokens, s.heads, s.head_dim}, opts);
    AttentionMask mask;
    mask.kind = MaskKind::kCausal;
    mask.cu_seqlens = torch::tensor(std::vector<int64_t>{0, s.tokens}, torch::kLong);

    Timing ours;
    ours.fwd = MedianSeconds([&] {
      torch::NoGradGuard no_grad;
      ballast::kernels::attention(q, k, v, mask, scale);
    });
    ours.fwd_bwd =
        MedianSeconds([&] { ballast::kernels::attention(q, k, v, mask, scale).backward(grad); });
    setenv("BALLAST_ATTENTION_SMEM_LIMIT", std::to_string(99 * 1024).c_str(), 1);
    const double small_fwd_bwd =
        MedianSeconds([&] { ballast::kernels::attention(q, k, v, mask, scale).backward(grad); });
    unsetenv("BALLAST_ATTENTION_SMEM_LIMIT");

    // SDPA takes (B, H, T, D); the transposed views keep D contiguous.
    const auto q4 = q.detach().transpose(0, 1).unsqueeze(0).requires_grad_(true);
    const auto k4 = k.detach().transpose(0, 1).unsqueeze(0).requires_grad_(true);
    const auto v4 = v.detach().transpose(0, 1).unsqueeze(0).requires_grad_(true);
    const auto grad4 = grad.transpose(0, 1).unsqueeze(0);
    Timing sdpa;
    {
      OnlyFlashSdpa only_flash;
      sdpa.fwd = MedianSeconds([&] {
        torch::NoGradGuard no_grad;
        at::scaled_dot_product_attention(q4, k4, v4, {}, 0.0, /*is_causal=*/true, scale);
      });
      sdpa.fwd_bwd = MedianSeconds([&] {
        at::scaled_dot_product_attention(q4, k4, v4, {}, 0.0, /*is_causal=*/true, scale)
            .backward(grad4);
      });
    }

    const double fwd_flops = 2.0 * static_cast<double>(s.tokens) * s.tokens * s.head_dim * s.heads;
    const double total_flops = 3.5 * fwd_flops;
    for (const auto& [name, flops, t_ours, t_sdpa] :
         {std::tuple<const char*, double, double, double>{"fwd", fwd_flops, ours.fwd, sdpa.fwd},
          {"fwd+bwd", total_flops, ours.fwd_bwd, sdpa.fwd_bwd},
          {"fwd+bwd_99KiB_tiles", total_flops, small_fwd_bwd, sdpa.fwd_bwd}}) {
      const double tf_ours = flops / t_ours / 1e12;
      const double tf_sdpa = flops / t_sdpa / 1e12;
      std::printf(
          "attention_cuda/%s T=%ld D=%ld vs sdpa_flash: %.2fx TFLOP/s (%.1f vs %.1f, H=%ld bf16 "
          "causal)\n",
          name, static_cast<long>(s.tokens), static_cast<long>(s.head_dim), tf_ours / tf_sdpa,
          tf_ours, tf_sdpa, static_cast<long>(s.heads));
      std::fflush(stdout);
    }
  }
  return 0;
}
