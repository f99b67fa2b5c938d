// gated_delta_rule_cuda_bench: forward and forward+backward time of the
// Gated DeltaNet CUDA kernel (kernels/gated_delta_rule.h on a CUDA device),
// one JSON line per shape, for bench/gpu/gated_delta_rule_vs_fla.py, which
// times fla's chunk_gated_delta_rule on the same shapes and prints the rows:
//   {"name": "...", "tokens": T, "docs": N, "hk": .., "hv": .., "d": ..,
//    "fwd_ms": .., "fwd_bwd_ms": ..}
// Shapes: one Qwen3.5-9B GDN layer (16 key heads, 32 value heads, head dim
// 128), bf16 q, k, v and fp32 g and beta, as one document of 32,768 tokens
// (FlashQLA's and the reference numbers' shape) and as 8 packed documents of
// 4,096. Time is the median of kReps synchronised runs after one warm-up;
// the loss of fwd+bwd is sum(out * grad) + sum(final_state).
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "bench/gpu/median_seconds.h"
#include "kernels/gated_delta_rule.h"

namespace {

constexpr int kReps = 5;

double MedianMs(const std::function<void()>& run) {
  return 1e3 * ballast::bench::MedianSeconds(run, kReps);
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::printf("gated_delta_rule_cuda_bench: no CUDA device, skipped\n");
    return 0;
  }
  struct Shape {
    const char* name;
    int64_t tokens, docs;
  };
  const int64_t hk = 16, hv = 32, d = 128;
  torch::manual_seed(0);
  for (const Shape& s :
       {Shape{"qwen3.5_layer_one_doc", 32768, 1}, Shape{"qwen3.5_layer_8_docs", 32768, 8}}) {
    const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
    const auto f32 = bf16.dtype(torch::kFloat);
    const auto q = torch::randn({s.tokens, hk, d}, bf16).requires_grad_(true);
    const auto k = torch::randn({s.tokens, hk, d}, bf16).requires_grad_(true);
    const auto v = torch::randn({s.tokens, hv, d}, bf16).requires_grad_(true);
    const auto g = (-torch::softplus(torch::randn({s.tokens, hv}, f32))).requires_grad_(true);
    const auto beta = torch::sigmoid(torch::randn({s.tokens, hv}, f32)).requires_grad_(true);
    const auto grad = torch::randn({s.tokens, hv, d}, bf16);
    std::vector<int64_t> cu;
    for (int64_t n = 0; n <= s.docs; ++n) cu.push_back(n * s.tokens / s.docs);
    const at::Tensor cu_seqlens = torch::tensor(cu, torch::kLong);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    auto run = [&] {
      return ballast::kernels::gated_delta_rule(q, k, v, g, beta, cu_seqlens, at::Tensor(), scale);
    };
    const double fwd = MedianMs([&] {
      torch::NoGradGuard no_grad;
      run();
    });
    const double fwd_bwd = MedianMs([&] {
      const ballast::kernels::GatedDeltaRuleOutput o = run();
      ((o.out * grad).sum() + o.final_state.sum()).backward();
    });
    std::printf(
        "{\"name\": \"%s\", \"tokens\": %ld, \"docs\": %ld, \"hk\": %ld, \"hv\": %ld, \"d\": %ld, "
        "\"fwd_ms\": %.3f, \"fwd_bwd_ms\": %.3f}\n",
        s.name, static_cast<long>(s.tokens), static_cast<long>(s.docs), static_cast<long>(hk),
        static_cast<long>(hv), static_cast<long>(d), fwd, fwd_bwd);
    std::fflush(stdout);
  }
  return 0;
}
