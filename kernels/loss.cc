// Dispatch and autograd for linear_cross_entropy (kernels/loss.h).
//
// Arguments are validated here, once, with messages that name the argument;
// the backends assume valid input. The counted rows (target != ignore_index)
// are found here, so every backend skips ignored rows and count needs no
// second pass. The forward also makes the gradients (see
// LinearCrossEntropyFunction and kernels/cpu/linear_cross_entropy_cpu.cc).
#include "kernels/loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "kernels/cpu/linear_cross_entropy_cpu.h"
#include "kernels/cuda/linear_cross_entropy_cuda.h"

namespace ballast::kernels {
namespace {

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                  const at::Tensor& token_weights, int64_t ignore_index, double z_loss) {
  TORCH_CHECK(hidden.dim() == 2, "linear_cross_entropy: hidden must be 2-D (T, H), got sizes ",
              hidden.sizes());
  TORCH_CHECK(weight.dim() == 2, "linear_cross_entropy: weight must be 2-D (V, H), got sizes ",
              weight.sizes());
  const int64_t tokens = hidden.size(0);
  const int64_t vocab = weight.size(0);
  TORCH_CHECK(weight.size(1) == hidden.size(1),
              "linear_cross_entropy: weight must have H = ", hidden.size(1),
              " columns like hidden, got sizes ", weight.sizes());
  const at::ScalarType dtype = hidden.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble,
      "linear_cross_entropy: hidden must be fp32, bf16, fp16 or fp64, got ", dtype);
  TORCH_CHECK(weight.scalar_type() == dtype,
              "linear_cross_entropy: weight must have hidden's dtype ", dtype, ", got ",
              weight.scalar_type());
  TORCH_CHECK(hidden.device().is_cpu() || hidden.device().is_cuda(),
              "linear_cross_entropy: hidden must be on CPU or CUDA, got ", hidden.device());
  TORCH_CHECK(weight.device() == hidden.device(), "linear_cross_entropy: weight is on ",
              weight.device(), " but hidden is on ", hidden.device());
  TORCH_CHECK(targets.scalar_type() == at::kLong,
              "linear_cross_entropy: targets must be int64, got ", targets.scalar_type());
  TORCH_CHECK(targets.dim() == 1 && targets.size(0) == tokens,
              "linear_cross_entropy: targets must be 1-D of length T = ", tokens, ", got sizes ",
              targets.sizes());
  TORCH_CHECK(targets.device() == hidden.device(), "linear_cross_entropy: targets is on ",
              targets.device(), " but hidden is on ", hidden.device());
  if (token_weights.defined()) {
    TORCH_CHECK(token_weights.scalar_type() == at::kFloat,
                "linear_cross_entropy: token_weights must be fp32, got ",
                token_weights.scalar_type());
    TORCH_CHECK(token_weights.dim() == 1 && token_weights.size(0) == tokens,
                "linear_cross_entropy: token_weights must be 1-D of length T = ", tokens,
                ", got sizes ", token_weights.sizes());
    TORCH_CHECK(token_weights.device() == hidden.device(),
                "linear_cross_entropy: token_weights is on ", token_weights.device(),
                " but hidden is on ", hidden.device());
  }
  TORCH_CHECK(std::isfinite(z_loss) && z_loss >= 0,
              "linear_cross_entropy: z_loss must be >= 0 "
              "and finite, got ",
              z_loss);
  // One reduction and, only on failure, a second to name the first bad position.
  at::Tensor bad = (targets.lt(0) | targets.ge(vocab)) & targets.ne(ignore_index);  // (T)
  if (bad.any().item<bool>()) {
    const int64_t pos = bad.to(at::kByte).argmax().item<int64_t>();
    TORCH_CHECK(false, "linear_cross_entropy: targets[", pos, "] = ", targets[pos].item<int64_t>(),
                " is outside [0, V = ", vocab, ") and is not ignore_index = ", ignore_index);
  }
}

// The one place that picks a backend. Returns the loss and, when asked for,
// its gradients for an upstream gradient of 1.
LceSumAndGrads sum_and_grads_on_device(const at::Tensor& hidden, const at::Tensor& weight,
                                       const at::Tensor& targets, const at::Tensor& rows,
                                       const at::Tensor& token_weights, double z_loss,
                                       bool need_hidden, bool need_weight) {
  if (!hidden.is_cuda()) {
    return linear_cross_entropy_cpu(hidden, weight, targets, rows, token_weights, z_loss,
                                    need_hidden, need_weight);
  }
  LceForward forward =
      linear_cross_entropy_cuda_forward(hidden, weight, targets, rows, token_weights, z_loss);
  LceSumAndGrads out{forward.sum, {}};
  if (need_hidden || need_weight) {
    out.unit_grads = linear_cross_entropy_cuda_backward(
        at::ones({}, forward.sum.options()), hidden, weight, targets, rows, token_weights,
        forward.lse, z_loss, need_hidden, need_weight);
  }
  return out;
}

// Differentiable in hidden and weight. targets, rows and token_weights are
// data: their gradient slots are always undefined. The forward already makes
// the gradients for an upstream gradient of 1 (which of them is fixed by the
// need_* flags, read from grad mode and requires_grad before apply), so the
// graph keeps (T, H) and (V, H) gradients instead of the inputs, and the
// backward scales them in place: scaling a fresh (V, H) copy would double the
// peak memory this loss exists to save. They are released by the first
// backward, so a second backward through the same graph is an error, as it is
// for any freed graph. The CPU backend's unit gradients are in the compute
// dtype and are rounded to the input dtype after scaling; the CUDA backend's
// come in the input dtype, so bf16 / fp16 gradients on CUDA are rounded twice
// (one extra rounding, not a bias: the factor is applied in fp32).
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& rows, const std::optional<at::Tensor>& token_weights,
                            double z_loss, bool need_hidden, bool need_weight) {
    // Undefined stands for "no weights" below; apply() only accepts that as an empty optional.
    LceSumAndGrads out =
        sum_and_grads_on_device(hidden, weight, targets, rows, token_weights.value_or(at::Tensor()),
                                z_loss, need_hidden, need_weight);
    ctx->saved_data["dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["d_hidden"] = out.unit_grads.hidden;
    ctx->saved_data["d_weight"] = out.unit_grads.weight;
    return out.sum;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    TORCH_CHECK(ctx->saved_data.count("d_hidden") == 1,
                "linear_cross_entropy: backward ran twice through the same loss; its "
                "gradients are released by the first backward (retain_graph is not supported)");
    const at::Tensor& grad_sum = grad_outputs[0];  // 0-dim, the loss's dtype
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    auto take_scaled = [&](const char* key) {
      at::Tensor grad = ctx->saved_data[key].toOptional<at::Tensor>().value_or(at::Tensor());
      ctx->saved_data.erase(key);
      // A 0-dim factor keeps grad's dtype and is applied at full precision.
      return grad.defined() ? grad.mul_(grad_sum).to(dtype) : grad;
    };
    at::Tensor d_hidden = take_scaled("d_hidden");
    at::Tensor d_weight = take_scaled("d_weight");
    return {d_hidden,     d_weight,     at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LossSum linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets,
                             const std::optional<at::Tensor>& token_weights, int64_t ignore_index,
                             double z_loss) {
  check_inputs(hidden, weight, targets, token_weights.value_or(at::Tensor()), ignore_index, z_loss);
  at::Tensor rows = targets.ne(ignore_index).nonzero().squeeze(1);  // (T_c) int64, increasing
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor sum = LinearCrossEntropyFunction::apply(hidden, weight, targets, rows, token_weights,
                                                     z_loss, grad_mode && hidden.requires_grad(),
                                                     grad_mode && weight.requires_grad());
  return {sum, at::scalar_tensor(rows.size(0), targets.options())};
}

}  // namespace ballast::kernels
