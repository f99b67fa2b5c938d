// causal_conv1d_silu(): argument checks, the dispatch between the CPU kernel,
// the CUDA kernel and the op-by-op path, and the op-by-op path itself.
#include "kernels/causal_conv1d.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <optional>
#include <vector>

#include "kernels/cpu/causal_conv1d_cpu.h"
#include "kernels/cu_seqlens_check.h"
#include "kernels/cuda/causal_conv1d_cuda.h"

namespace ballast::kernels {
namespace {

void CheckInputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cu_seqlens,
                 const at::Tensor& initial_window) {
  TORCH_CHECK(x.defined() && x.dim() == 2, "causal_conv1d_silu: x must be (T, C), got sizes ",
              x.defined() ? x.sizes() : at::IntArrayRef{});
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "causal_conv1d_silu: x must be float32 or bfloat16, got ", x.scalar_type());
  TORCH_CHECK(x.stride(1) == 1 || x.size(1) <= 1,
              "causal_conv1d_silu: x must have unit stride in C");
  const int64_t tokens = x.size(0), channels = x.size(1);
  TORCH_CHECK(channels >= 1, "causal_conv1d_silu: x must have C >= 1 channels");
  TORCH_CHECK(
      weight.defined() && weight.dim() == 2 && weight.size(0) == channels && weight.size(1) >= 1,
      "causal_conv1d_silu: weight must be (C, K) = (", channels, ", K >= 1), got ",
      weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
              "causal_conv1d_silu: weight must have x's dtype or float32, got ",
              weight.scalar_type());
  TORCH_CHECK(weight.device() == x.device(), "causal_conv1d_silu: weight must be on x's device");
  const int64_t docs = CheckCuSeqlens("causal_conv1d_silu", cu_seqlens, tokens);
  if (initial_window.defined()) {
    const int64_t width = weight.size(1) - 1;
    TORCH_CHECK(initial_window.dim() == 3 && initial_window.size(0) == docs &&
                    initial_window.size(1) == channels && initial_window.size(2) == width,
                "causal_conv1d_silu: initial_window must be (N, C, K - 1) = (", docs, ", ",
                channels, ", ", width, "), got ", initial_window.sizes());
    TORCH_CHECK(initial_window.scalar_type() == x.scalar_type() ||
                    initial_window.scalar_type() == at::kFloat,
                "causal_conv1d_silu: initial_window must have x's dtype or float32, got ",
                initial_window.scalar_type());
    TORCH_CHECK(initial_window.device() == x.device(),
                "causal_conv1d_silu: initial_window must be on x's device");
  }
}

// The kernel under autograd, the CPU's or the CUDA one by x's device (both
// have one contract): keeps x, weight and the window, and recomputes the
// pre-activation in the backward.
class CausalConv1dKernelFunction : public torch::autograd::Function<CausalConv1dKernelFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight,
                            const std::optional<at::Tensor>& initial_window,
                            const at::Tensor& cu_seqlens) {
    const at::Tensor window = initial_window.value_or(at::Tensor());
    ctx->save_for_backward({x, weight, window});
    ctx->saved_data["cu_seqlens"] = cu_seqlens;
    return x.is_cuda() ? causal_conv1d_silu_cuda_forward(x, weight, cu_seqlens, window)
                       : causal_conv1d_silu_cpu_forward(x, weight, cu_seqlens, window);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor cu_seqlens = ctx->saved_data["cu_seqlens"].toTensor();
    CausalConv1dGrads grads = saved[0].is_cuda()
                                  ? causal_conv1d_silu_cuda_backward(saved[0], saved[1], cu_seqlens,
                                                                     saved[2], grad_outputs[0])
                                  : causal_conv1d_silu_cpu_backward(saved[0], saved[1], cu_seqlens,
                                                                    saved[2], grad_outputs[0]);
    return {grads.d_x, grads.d_weight, grads.d_window, at::Tensor()};
  }
};

}  // namespace

at::Tensor causal_conv1d_silu_aten(const at::Tensor& x, const at::Tensor& weight,
                                   const at::Tensor& cu_seqlens, const at::Tensor& initial_window) {
  CheckInputs(x, weight, cu_seqlens, initial_window);
  const int64_t tokens = x.size(0), channels = x.size(1), taps = weight.size(1);
  const int64_t width = taps - 1;
  const at::Tensor cu = cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  const int64_t docs = cu.numel() - 1;
  // Rows T.. of `source` are the windows, document n's K - 1 inputs at
  // T + n (K - 1) + p for relative position p - (K - 1); without windows, row
  // T is a zero row that every shift across a start reads.
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor extra =
      initial_window.defined()
          ? initial_window.to(at::kFloat).transpose(1, 2).reshape({docs * width, channels})
          : at::zeros({1, channels}, xf.options());
  const at::Tensor source = at::cat({xf, extra}, 0);
  std::vector<int64_t> start(tokens);  // each token's document start
  for (int64_t n = 0; n < docs; ++n) {
    for (int64_t t = c[n]; t < c[n + 1]; ++t) start[t] = n;
  }
  const at::Tensor wf = weight.to(at::kFloat);
  at::Tensor acc = at::zeros({tokens, channels}, xf.options());
  for (int64_t j = 0; j < taps; ++j) {
    const int64_t shift = width - j;  // tap j reads x[t - shift]
    std::vector<int64_t> index(tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      const int64_t n = start[t];
      const int64_t relative = t - shift - c[n];
      if (relative >= 0) {
        index[t] = t - shift;
      } else {
        index[t] = initial_window.defined() ? tokens + n * width + width + relative : tokens;
      }
    }
    const at::Tensor idx = at::tensor(index, at::kLong).to(x.device());
    acc = acc + source.index_select(0, idx) * wf.select(1, j);
  }
  return at::silu(acc).to(x.scalar_type());
}

at::Tensor causal_conv1d_silu(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& cu_seqlens, const at::Tensor& initial_window) {
  CheckInputs(x, weight, cu_seqlens, initial_window);
  if (x.device().is_cpu() || causal_conv1d_cuda_supports(x.device()))
    return CausalConv1dKernelFunction::apply(
        x, weight,
        initial_window.defined() ? std::optional<at::Tensor>(initial_window) : std::nullopt,
        cu_seqlens);
  return causal_conv1d_silu_aten(x, weight, cu_seqlens, initial_window);
}

}  // namespace ballast::kernels
