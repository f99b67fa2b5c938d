// The float64 reference for linear_cross_entropy, shared by the CPU and CUDA
// kernel tests: F::cross_entropy on the full (T, V) logits, as plain as the
// math. Test-only; it materialises [T, V] on purpose.
#ifndef BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_
#define BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_

#include <torch/torch.h>

#include <cstdint>
#include <optional>

namespace ballast::kernels::cross_entropy_reference {

inline constexpr int64_t kIgnore = -100;

struct Result {
  at::Tensor sum;       // scalar, float64
  at::Tensor d_hidden;  // (T, H), float64
  at::Tensor d_weight;  // (V, H), float64
};

// sum_t [target_t != ignore] * w_t * (cross_entropy_t + z_loss * lse_t^2) on
// the full (T, V) logits in float64, on the inputs' device, with the gradients
// of upstream * sum by autograd.
inline Result Reference(const at::Tensor& hidden, const at::Tensor& weight,
                        const at::Tensor& targets, const std::optional<at::Tensor>& token_weights,
                        double z_loss, double upstream = 1.0) {
  namespace F = torch::nn::functional;
  at::Tensor h = hidden.detach().to(torch::kDouble).requires_grad_();
  at::Tensor w = weight.detach().to(torch::kDouble).requires_grad_();
  at::Tensor logits = h.mm(w.t());
  at::Tensor per_token = F::cross_entropy(
      logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kNone).ignore_index(kIgnore));
  at::Tensor counted = targets.ne(kIgnore).to(torch::kDouble);
  per_token = per_token + z_loss * logits.logsumexp(1).square() * counted;
  if (token_weights) per_token = per_token * token_weights->to(torch::kDouble);
  at::Tensor sum = per_token.sum();
  (sum * upstream).backward();
  return {sum.detach(), h.grad(), w.grad()};
}

}  // namespace ballast::kernels::cross_entropy_reference

#endif  // BALLAST_TESTS_UNIT_KERNELS_LINEAR_CROSS_ENTROPY_REFERENCE_H_
