// Dispatch and autograd for linear_cross_entropy (kernels/loss.h).
//
// Arguments are validated here, once, with messages that name the argument;
// the backends assume valid input. The counted rows (target != ignore_index)
// are found here, so every backend skips ignored rows and count needs no
// second pass. The autograd Function saves the inputs and the per-row
// log-sum-exp; its backward recomputes logits tile by tile (see
// kernels/cpu/linear_cross_entropy_cpu.cc for the math).
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

// The one place that picks a backend.
LceForward forward_on_device(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, const at::Tensor& rows,
                             const at::Tensor& token_weights, double z_loss) {
  if (hidden.is_cuda()) {
    return linear_cross_entropy_cuda_forward(hidden, weight, targets, rows, token_weights, z_loss);
  }
  return linear_cross_entropy_cpu_forward(hidden, weight, targets, rows, token_weights, z_loss);
}

LceGrads backward_on_device(const at::Tensor& grad_sum, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& rows, const at::Tensor& token_weights,
                            const at::Tensor& lse, double z_loss, bool need_hidden,
                            bool need_weight) {
  if (hidden.is_cuda()) {
    return linear_cross_entropy_cuda_backward(grad_sum, hidden, weight, targets, rows,
                                              token_weights, lse, z_loss, need_hidden, need_weight);
  }
  return linear_cross_entropy_cpu_backward(grad_sum, hidden, weight, targets, rows, token_weights,
                                           lse, z_loss, need_hidden, need_weight);
}

// Differentiable in hidden and weight. targets, rows and token_weights are
// data: their gradient slots are always undefined.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& rows, const std::optional<at::Tensor>& token_weights,
                            double z_loss) {
    // Undefined stands for "no weights" below; apply() only accepts that as an empty optional.
    const at::Tensor weights = token_weights.value_or(at::Tensor());
    LceForward out = forward_on_device(hidden, weight, targets, rows, weights, z_loss);
    ctx->save_for_backward({hidden, weight, targets, rows, weights, out.lse});
    ctx->saved_data["z_loss"] = z_loss;
    return out.sum;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    LceGrads grads = backward_on_device(grad_outputs[0], saved[0], saved[1], saved[2], saved[3],
                                        saved[4], saved[5], ctx->saved_data["z_loss"].toDouble(),
                                        ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    return {grads.hidden, grads.weight, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LossSum linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets,
                             const std::optional<at::Tensor>& token_weights, int64_t ignore_index,
                             double z_loss) {
  check_inputs(hidden, weight, targets, token_weights.value_or(at::Tensor()), ignore_index, z_loss);
  at::Tensor rows = targets.ne(ignore_index).nonzero().squeeze(1);  // (T_c) int64, increasing
  at::Tensor sum =
      LinearCrossEntropyFunction::apply(hidden, weight, targets, rows, token_weights, z_loss);
  return {sum, at::scalar_tensor(rows.size(0), targets.options())};
}

}  // namespace ballast::kernels
