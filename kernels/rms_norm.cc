// rms_norm(): argument checks, the autograd wrapper for the fused CPU pass,
// and the op-by-op path for everything else.
#include "kernels/rms_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "kernels/cpu/rms_norm_cpu.h"

namespace ballast::kernels {
namespace {

// Keeps x, weight and one fp32 per row; the op-by-op graph keeps x, n and the
// per-row statistics.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  // x (T, G, H) with unit stride in H; returns (T * G, H).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, double eps) {
    RmsNormForward out = rms_norm_cpu_forward(x, weight, eps);
    ctx->save_for_backward({x, weight, out.rstd});
    return out.y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    RmsNormGrads grads = rms_norm_cpu_backward(x, saved[1], saved[2], grad_outputs[0].contiguous(),
                                               ctx->needs_input_grad(1));
    return {grads.d_x.view(x.sizes()), grads.d_weight, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) > 0,
              "rms_norm: x must have a non-empty last dimension");
  const int64_t h = x.size(-1);
  TORCH_CHECK(weight.defined() && weight.dim() == 1 && weight.size(0) == h,
              "rms_norm: weight must be (", h, "), got ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(eps > 0, "rms_norm: eps must be positive, got ", eps);
  if (x.device().is_cpu() && weight.device().is_cpu() && x.scalar_type() == at::kFloat &&
      weight.scalar_type() == at::kFloat) {
    // (T, G, H) over x's own strides where they allow it, so that per-head
    // norms read the fused projection without a copy.
    at::Tensor x3;
    if (x.stride(-1) == 1 && x.dim() == 3)
      x3 = x;
    else if (x.stride(-1) == 1 && x.dim() == 2)
      x3 = x.unsqueeze(1);
    else
      x3 = x.contiguous().view({-1, 1, h});
    return RmsNormFunction::apply(x3, weight, eps).view(x.sizes());
  }
  const at::Tensor normed = at::rms_norm(x.to(at::kFloat), {h}, std::nullopt, eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor rms_norm_zero_centred(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(weight.defined(), "rms_norm_zero_centred: weight must be defined");
  const at::Tensor scale = weight.to(at::kFloat) + 1.0;  // HF: 1.0 + weight.float()
  if (x.device().is_cpu() && x.scalar_type() == at::kFloat) return rms_norm(x, scale, eps);
  TORCH_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.numel(),
              "rms_norm_zero_centred: x's last dimension must be weight's size ", weight.numel());
  const at::Tensor normed = at::rms_norm(x.to(at::kFloat), {x.size(-1)}, std::nullopt, eps);
  return (normed * scale).to(x.scalar_type());
}

}  // namespace ballast::kernels
