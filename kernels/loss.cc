// Dispatch and autograd for linear_cross_entropy (kernels/loss.h).
//
// Arguments are validated here, once, with messages that name the argument;
// the backends assume valid input. The counted rows (target != ignore_index)
// are found here, so every backend skips ignored rows and count needs no
// second pass. On CPU the forward also makes the gradients; on CUDA the
// backward does (see LinearCrossEntropyFunction).
#include "kernels/loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "kernels/cpu/linear_cross_entropy_cpu.h"
#include "kernels/cuda/linear_cross_entropy_cuda.h"

namespace ballast::kernels {
namespace {

void check_inputs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                  const at::Tensor& token_weights, int64_t ignore_index, double z_loss,
                  bool on_host) {
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
  if (!on_host) {
    at::_assert_async(bad.any().logical_not(),
                      "linear_cross_entropy: a target is outside [0, V) and is not ignore_index");
    return;
  }
  if (bad.any().item<bool>()) {
    const int64_t pos = bad.to(at::kByte).argmax().item<int64_t>();
    TORCH_CHECK(false, "linear_cross_entropy: targets[", pos, "] = ", targets[pos].item<int64_t>(),
                " is outside [0, V = ", vocab, ") and is not ignore_index = ", ignore_index);
  }
}

// Differentiable in hidden and weight. targets, rows and token_weights are
// data: their gradient slots are always undefined. The one place that picks a
// backend; the two keep different things for the backward, for memory:
//
// CPU: the forward already makes the gradients for an upstream gradient of 1
// in the compute dtype (which of them is fixed by the need_* flags, read from
// grad mode and requires_grad before apply; the CPU kernel holds whole rows
// of logits once, so making both in one pass saves a second product). The
// backward scales them in place in fp32 and only then rounds them to the
// input dtype: scaling a fresh (V, H) copy would double the peak memory this
// loss exists to save. They are released by the first backward, so a second
// backward through the same graph is an error, as for any freed graph.
//
// CUDA: the forward keeps only the (T_c) fp32 log-sum-exp; the inputs it
// saves are already alive (an activation and a parameter). The backward runs
// the CUDA gradient kernel with the real upstream gradient, which enters the
// fp32 per-row coefficients before anything is rounded, and each gradient is
// rounded once to the input dtype. Unit gradients made in the forward would
// be (V, H) + (T, H) held through the whole decoder backward (622 MB in fp32
// for Qwen3-0.6B's head alone), and rounding them to fp16 before the scaling
// overflowed: unit dW sums over every token and passes 65504. The CUDA
// kernel recomputes the logits in its backward either way, so this costs no
// extra product.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const at::Tensor& rows, const std::optional<at::Tensor>& token_weights,
                            double z_loss, bool need_hidden, bool need_weight) {
    // Undefined stands for "no weights" below; apply() only accepts that as an empty optional.
    const at::Tensor tw = token_weights.value_or(at::Tensor());
    ctx->saved_data["on_cuda"] = hidden.is_cuda();
    if (hidden.is_cuda()) {
      LceForward out = linear_cross_entropy_cuda_forward(hidden, weight, targets, rows, tw, z_loss);
      if (need_hidden || need_weight) {
        ctx->save_for_backward({hidden, weight, targets, rows, tw, out.lse});
        ctx->saved_data["z_loss"] = z_loss;
      }
      return out.sum;
    }
    LceSumAndGrads out = linear_cross_entropy_cpu(hidden, weight, targets, rows, tw, z_loss,
                                                  need_hidden, need_weight);
    ctx->saved_data["dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["d_hidden"] = out.unit_grads.hidden;
    ctx->saved_data["d_weight"] = out.unit_grads.weight;
    return out.sum;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor& grad_sum = grad_outputs[0];  // 0-dim, the loss's dtype
    at::Tensor d_hidden, d_weight;
    if (ctx->saved_data["on_cuda"].toBool()) {
      const torch::autograd::variable_list saved = ctx->get_saved_variables();
      LceGrads grads = linear_cross_entropy_cuda_backward(
          grad_sum, saved[0], saved[1], saved[2], saved[3], saved[4], saved[5],
          ctx->saved_data["z_loss"].toDouble(), ctx->needs_input_grad(0), ctx->needs_input_grad(1));
      d_hidden = grads.hidden;
      d_weight = grads.weight;
    } else {
      TORCH_CHECK(ctx->saved_data.count("d_hidden") == 1,
                  "linear_cross_entropy: backward ran twice through the same loss; its "
                  "gradients are released by the first backward (retain_graph is not supported)");
      const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
      auto take_scaled = [&](const char* key) {
        at::Tensor grad = ctx->saved_data[key].toOptional<at::Tensor>().value_or(at::Tensor());
        ctx->saved_data.erase(key);
        // A 0-dim factor keeps grad's dtype and is applied at full precision.
        return grad.defined() ? grad.mul_(grad_sum).to(dtype) : grad;
      };
      d_hidden = take_scaled("d_hidden");
      d_weight = take_scaled("d_weight");
    }
    return {d_hidden,     d_weight,     at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

LossSum linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets,
                             const std::optional<at::Tensor>& token_weights, int64_t ignore_index,
                             double z_loss, int64_t counted) {
  TORCH_CHECK(counted >= -1, "linear_cross_entropy: counted must be -1 or a count, got ", counted);
  // Without a count the targets are read on the host: checked with a message
  // and counted by nonzero(), which waits for the device on CUDA.
  const bool on_host = !targets.is_cuda() || counted < 0;
  check_inputs(hidden, weight, targets, token_weights.value_or(at::Tensor()), ignore_index, z_loss,
               on_host);
  const at::Tensor counted_rows = targets.ne(ignore_index);  // (T) bool
  at::Tensor rows =
      on_host ? counted_rows.nonzero().squeeze(1)
              : at::nonzero_static(counted_rows, counted).squeeze(1);  // (T_c), increasing
  TORCH_CHECK(counted < 0 || rows.size(0) == counted, "linear_cross_entropy: counted = ", counted,
              ", but ", rows.size(0), " targets are not ignore_index");
  const bool grad_mode = at::GradMode::is_enabled();
  at::Tensor sum = LinearCrossEntropyFunction::apply(hidden, weight, targets, rows, token_weights,
                                                     z_loss, grad_mode && hidden.requires_grad(),
                                                     grad_mode && weight.requires_grad());
  return {sum, at::scalar_tensor(rows.size(0), targets.options())};
}

}  // namespace ballast::kernels
