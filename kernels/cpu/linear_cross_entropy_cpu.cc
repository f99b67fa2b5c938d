// Chunked linear cross-entropy on CPU: logits = hidden @ weight^T without the
// (T, V) logits.
//
// Inputs: hidden (T, H) and weight (V, H) in fp32 / bf16 / fp16 (compute in
// fp32) or fp64 (compute in fp64, for gradient checks); targets (T) int64;
// rows (T_c) int64, the counted positions; token_weights (T) fp32 or undefined.
// For each counted row t, with z = hidden_t @ weight^T:
//   lse_t  = log sum_v exp(z_v)
//   loss_t = w_t * (lse_t - z[target_t] + z_loss * lse_t^2)
// and the result is sum_t loss_t. The backward, for an upstream gradient g:
//   dloss/dz_v = g * w_t * (softmax(z)_v * (1 + 2 * z_loss * lse_t) - [v == target_t])
//   dhidden_t  = dz @ weight,  dweight = dz^T @ hidden.
//
// Tiling: counted rows are taken kLceChunkRows at a time and gathered from
// hidden, so ignored rows cost nothing. Each row chunk sweeps the vocabulary in
// tiles of kLceChunkVocab rows of weight; a tile's logits come from one at::mm
// on operands upcast to the compute dtype. The forward keeps an online
// log-sum-exp (running max and rescaled running sum) across tiles and saves
// lse (T_c); the backward recomputes each tile's logits from lse.
//
// Guarantees: working memory beyond the inputs, dhidden (T, H) and dweight
// (V, H, in the compute dtype) is O(kLceChunkRows * kLceChunkVocab +
// (kLceChunkRows + kLceChunkVocab) * H + T); the log-sum-exp is fp32 (fp64 for
// fp64 inputs); every exponent is of z - max or z - lse <= 0 (up to rounding),
// so logits of +-1e4 give finite loss and gradients; ignored rows get zero
// gradient; the summation order is fixed, so results do not depend on the
// thread count beyond at::mm's own reduction order.
#include "kernels/cpu/linear_cross_entropy_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

namespace ballast::kernels {
namespace {

static_assert(kLceChunkRows > 0 && kLceChunkVocab > 0, "tiles must be non-empty");
static_assert(kLceChunkRows * kLceChunkVocab <= (int64_t{1} << 24),
              "a logits tile stays at most 64 MiB in fp32");

// bf16 and fp16 logits lose too much to feed a log-sum-exp; fp64 stays fp64 so
// that finite differences in fp64 can check the gradients.
at::ScalarType compute_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// The column of each row's target inside vocab tile [v0, v0 + nv), clamped so
// that rows whose target lies elsewhere still index in bounds, and the mask of
// rows whose target does lie in the tile.
struct TargetsInTile {
  at::Tensor column;   // (ct, 1) int64
  at::Tensor present;  // (ct) bool
};

TargetsInTile targets_in_tile(const at::Tensor& targets, int64_t v0, int64_t nv) {
  return {(targets - v0).clamp_(0, nv - 1).unsqueeze(1),
          targets.ge(v0).logical_and_(targets.lt(v0 + nv))};
}

// token_weights gathered at rows, in the compute dtype; ones when undefined.
at::Tensor row_weights(const at::Tensor& token_weights, const at::Tensor& rows,
                       at::ScalarType acc) {
  if (!token_weights.defined()) return at::ones({rows.size(0)}, rows.options().dtype(acc));
  return token_weights.index_select(0, rows).to(acc);
}

}  // namespace

LceForward linear_cross_entropy_cpu_forward(const at::Tensor& hidden, const at::Tensor& weight,
                                            const at::Tensor& targets, const at::Tensor& rows,
                                            const at::Tensor& token_weights, double z_loss) {
  const at::ScalarType acc = compute_dtype(hidden.scalar_type());
  const at::TensorOptions opts = hidden.options().dtype(acc);
  const int64_t counted = rows.size(0);
  const int64_t vocab = weight.size(0);

  at::Tensor row_targets = targets.index_select(0, rows);  // (T_c)
  at::Tensor lse = at::empty({counted}, opts);             // (T_c)
  at::Tensor loss = at::empty({counted}, opts);            // (T_c)
  for (int64_t r0 = 0; r0 < counted; r0 += kLceChunkRows) {
    const int64_t ct = std::min(kLceChunkRows, counted - r0);
    at::Tensor h = hidden.index_select(0, rows.narrow(0, r0, ct)).to(acc);  // (ct, H)
    at::Tensor tgt = row_targets.narrow(0, r0, ct);                         // (ct)
    // -inf start: the first tile rescales the empty sum by exp(-inf) = 0.
    at::Tensor run_max = at::full({ct}, -std::numeric_limits<double>::infinity(), opts);  // (ct)
    at::Tensor run_sum = at::zeros({ct}, opts);                                           // (ct)
    at::Tensor z_target = at::zeros({ct}, opts);                                          // (ct)
    for (int64_t v0 = 0; v0 < vocab; v0 += kLceChunkVocab) {
      const int64_t nv = std::min(kLceChunkVocab, vocab - v0);
      at::Tensor logits = at::mm(h, weight.narrow(0, v0, nv).to(acc).t());  // (ct, nv)
      // Picked from the same tile as the log-sum-exp, so lse - z_target >= 0
      // holds up to rounding even when both are ~1e4.
      TargetsInTile in_tile = targets_in_tile(tgt, v0, nv);
      z_target.add_(at::where(in_tile.present, logits.gather(1, in_tile.column).squeeze(1), 0));
      at::Tensor new_max = at::maximum(run_max, std::get<0>(logits.max(1)));  // (ct)
      run_sum.mul_((run_max - new_max).exp_())
          .add_(logits.sub_(new_max.unsqueeze(1)).exp_().sum(1));
      run_max = new_max;
    }
    at::Tensor lse_c = lse.narrow(0, r0, ct);  // (ct)
    lse_c.copy_(run_max + run_sum.log_());
    loss.narrow(0, r0, ct).copy_(lse_c - z_target + z_loss * lse_c.square());
  }
  loss.mul_(row_weights(token_weights, rows, acc));
  return {loss.sum(), lse};
}

LceGrads linear_cross_entropy_cpu_backward(const at::Tensor& grad_sum, const at::Tensor& hidden,
                                           const at::Tensor& weight, const at::Tensor& targets,
                                           const at::Tensor& rows, const at::Tensor& token_weights,
                                           const at::Tensor& lse, double z_loss, bool need_hidden,
                                           bool need_weight) {
  const at::ScalarType acc = compute_dtype(hidden.scalar_type());
  const at::TensorOptions opts = hidden.options().dtype(acc);
  const int64_t counted = rows.size(0);
  const int64_t vocab = weight.size(0);

  LceGrads grads;
  // Ignored rows are never written, so they keep the zero they start with.
  if (need_hidden) grads.hidden = at::zeros(hidden.sizes(), hidden.options());  // (T, H)
  // dweight sums over every row chunk, so it accumulates in the compute dtype.
  at::Tensor dweight = need_weight ? at::zeros(weight.sizes(), opts) : at::Tensor();  // (V, H)

  at::Tensor row_targets = targets.index_select(0, rows);                          // (T_c)
  at::Tensor coef = row_weights(token_weights, rows, acc).mul_(grad_sum.to(acc));  // (T_c)
  at::Tensor softmax_scale = coef * (1.0 + 2.0 * z_loss * lse);                    // (T_c)
  for (int64_t r0 = 0; r0 < counted; r0 += kLceChunkRows) {
    const int64_t ct = std::min(kLceChunkRows, counted - r0);
    at::Tensor idx = rows.narrow(0, r0, ct);
    at::Tensor h = hidden.index_select(0, idx).to(acc);                 // (ct, H)
    at::Tensor tgt = row_targets.narrow(0, r0, ct);                     // (ct)
    at::Tensor lse_c = lse.narrow(0, r0, ct).unsqueeze(1);              // (ct, 1)
    at::Tensor scale_c = softmax_scale.narrow(0, r0, ct).unsqueeze(1);  // (ct, 1)
    at::Tensor neg_coef_c = coef.narrow(0, r0, ct).neg().unsqueeze(1);  // (ct, 1)
    at::Tensor dh = need_hidden ? at::zeros_like(h) : at::Tensor();     // (ct, H)
    for (int64_t v0 = 0; v0 < vocab; v0 += kLceChunkVocab) {
      const int64_t nv = std::min(kLceChunkVocab, vocab - v0);
      at::Tensor w = weight.narrow(0, v0, nv).to(acc);  // (nv, H)
      // The tile becomes dloss/dlogits in place: softmax * scale, then the
      // one-hot term at targets inside this tile.
      at::Tensor dlogits = at::mm(h, w.t());  // (ct, nv)
      dlogits.sub_(lse_c).exp_().mul_(scale_c);
      TargetsInTile in_tile = targets_in_tile(tgt, v0, nv);
      dlogits.scatter_add_(1, in_tile.column,
                           neg_coef_c.masked_fill(in_tile.present.logical_not().unsqueeze(1), 0));
      if (need_hidden) dh.addmm_(dlogits, w);
      if (need_weight) dweight.narrow(0, v0, nv).addmm_(dlogits.t(), h);
    }
    if (need_hidden) grads.hidden.index_copy_(0, idx, dh.to(hidden.scalar_type()));
  }
  if (need_weight) grads.weight = dweight.to(weight.scalar_type());
  return grads;
}

}  // namespace ballast::kernels
