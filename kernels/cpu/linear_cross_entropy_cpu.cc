// Chunked linear cross-entropy on CPU: logits = hidden @ weight^T without the
// (T, V) logits.
//
// Inputs: hidden (T, H) and weight (V, H) in fp32 / bf16 / fp16 (compute in
// fp32) or fp64 (compute in fp64, for gradient checks); targets (T) int64;
// rows (T_c) int64, the counted positions; token_weights (T) fp32 or undefined.
// For each counted row t, with z = hidden_t @ weight^T:
//   lse_t  = log sum_v exp(z_v)
//   loss_t = w_t * (lse_t - z[target_t] + z_loss * lse_t^2)
// and the result is sum_t loss_t. Its gradient, for an upstream gradient of 1:
//   dloss/dz_v = w_t * (softmax(z)_v * (1 + 2 * z_loss * lse_t) - [v == target_t])
//   dhidden_t  = dz @ weight,  dweight = dz^T @ hidden.
//
// One pass, three products. Counted rows are taken lce_block_rows() at a time
// (gathered from hidden, so ignored rows cost nothing), and a block's logits
// are computed for the whole vocabulary: one product. The block then becomes
// dloss/dz in place, and two more products give its share of dhidden and
// dweight. The gradients are therefore made in the forward, for an upstream
// gradient of 1, and the backward only scales them. Tiling over V as well
// would bound memory further but costs a fourth product: a row's gradient
// needs its log-sum-exp over all of V, so the logits would be computed twice,
// and that product is a third of the whole cost.
//
// Guarantees: working memory beyond the inputs, dhidden (T, H) and dweight
// (V, H, in the compute dtype) is one logits block (<= kLceLogitsBlockBytes)
// plus O((block rows + kLceChunkVocab) * H + T); the log-sum-exp is fp32 (fp64
// for fp64 inputs); every exponent is of z - max(z) <= 0, so logits of +-1e4
// give finite loss and gradients; ignored rows get zero gradient; the
// summation order is fixed, so results do not depend on the thread count
// beyond at::mm's own reduction order.
#include "kernels/cpu/linear_cross_entropy_cpu.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace ballast::kernels {
namespace {

// bf16 and fp16 logits lose too much to feed a log-sum-exp; fp64 stays fp64 so
// that finite differences in fp64 can check the gradients.
at::ScalarType compute_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

// token_weights gathered at rows, in the compute dtype; ones when undefined.
at::Tensor row_weights(const at::Tensor& token_weights, const at::Tensor& rows,
                       at::ScalarType acc) {
  if (!token_weights.defined()) return at::ones({rows.size(0)}, rows.options().dtype(acc));
  return token_weights.index_select(0, rows).to(acc);
}

// Calls visit(v0, w) for consecutive row ranges [v0, v0 + w.size(0)) of weight
// in the compute dtype. A weight already in that dtype is one range, so each
// product is a single large GEMM; a bf16 or fp16 one is upcast a tile at a time.
template <typename Visit>
void for_each_vocab_tile(const at::Tensor& weight, at::ScalarType acc, Visit visit) {
  const int64_t vocab = weight.size(0);
  if (weight.scalar_type() == acc) {
    visit(int64_t{0}, weight);
    return;
  }
  for (int64_t v0 = 0; v0 < vocab; v0 += kLceChunkVocab) {
    visit(v0, weight.narrow(0, v0, std::min(kLceChunkVocab, vocab - v0)).to(acc));
  }
}

}  // namespace

int64_t lce_block_rows(int64_t vocab, int64_t element_bytes) {
  const int64_t rows = kLceLogitsBlockBytes / (std::max<int64_t>(vocab, 1) * element_bytes);
  // A multiple of 8 keeps the GEMM's narrow dimension in whole vector widths.
  return rows >= 8 ? std::min(rows / 8 * 8, kLceMaxBlockRows) : std::max<int64_t>(rows, 1);
}

LceSumAndGrads linear_cross_entropy_cpu(const at::Tensor& hidden, const at::Tensor& weight,
                                        const at::Tensor& targets, const at::Tensor& rows,
                                        const at::Tensor& token_weights, double z_loss,
                                        bool need_hidden, bool need_weight) {
  const at::ScalarType acc = compute_dtype(hidden.scalar_type());
  const at::TensorOptions opts = hidden.options().dtype(acc);
  const int64_t counted = rows.size(0);
  const int64_t vocab = weight.size(0);
  const int64_t block_rows = lce_block_rows(vocab, at::elementSize(acc));
  const bool need_grads = need_hidden || need_weight;

  LceSumAndGrads out;
  // Ignored rows are never written, so they keep the zero they start with.
  if (need_hidden) out.unit_grads.hidden = at::zeros(hidden.sizes(), opts);  // (T, H)
  // dweight sums over every row block, so it accumulates in the compute dtype.
  at::Tensor dweight = need_weight ? at::zeros(weight.sizes(), opts) : at::Tensor();  // (V, H)

  at::Tensor row_targets = targets.index_select(0, rows);   // (T_c)
  at::Tensor coef = row_weights(token_weights, rows, acc);  // (T_c)
  at::Tensor loss = at::empty({counted}, opts);             // (T_c)
  // Transposed, (V, rows): the products then run with the vocabulary as the
  // long dimension M, which MKL handles at ~1.3x the speed of the (rows, V)
  // layout for blocks of ~100 rows, and the per-row reductions run down
  // columns, vectorised across the rows.
  at::Tensor logits_storage = at::empty({vocab, std::min(block_rows, counted)}, opts);
  for (int64_t r0 = 0; r0 < counted; r0 += block_rows) {
    const int64_t ct = std::min(block_rows, counted - r0);
    at::Tensor idx = rows.narrow(0, r0, ct);
    at::Tensor h = hidden.index_select(0, idx).to(acc);           // (ct, H)
    at::Tensor tgt = row_targets.narrow(0, r0, ct).unsqueeze(0);  // (1, ct)
    at::Tensor z = logits_storage.narrow(1, 0, ct);               // (V, ct)
    for_each_vocab_tile(weight, acc, [&](int64_t v0, const at::Tensor& w) {
      at::Tensor z_tile = z.narrow(0, v0, w.size(0));  // strided; BLAS writes it in place
      at::mm_out(z_tile, w, h.t());
    });
    at::Tensor z_target = z.gather(0, tgt).squeeze(0);                // (ct)
    at::Tensor row_max = z.amax(0);                                   // (ct)
    at::Tensor sum_exp = z.sub_(row_max.unsqueeze(0)).exp_().sum(0);  // (ct); z is now exp(z - max)
    at::Tensor lse = row_max.add_(sum_exp.log());                     // (ct)
    loss.narrow(0, r0, ct).copy_(lse - z_target + z_loss * lse.square());
    if (!need_grads) continue;

    // z becomes dloss/dz: softmax * w * (1 + 2 z_loss lse), then -w at the target.
    at::Tensor coef_c = coef.narrow(0, r0, ct);  // (ct)
    z.mul_((coef_c * (1.0 + 2.0 * z_loss * lse) / sum_exp).unsqueeze(0));
    z.scatter_add_(0, tgt, coef_c.neg().unsqueeze(0));
    at::Tensor dh = need_hidden ? at::zeros_like(h) : at::Tensor();  // (ct, H)
    for_each_vocab_tile(weight, acc, [&](int64_t v0, const at::Tensor& w) {
      at::Tensor dz = z.narrow(0, v0, w.size(0));  // (nv, ct)
      if (need_hidden) dh.addmm_(dz.t(), w);
      if (need_weight) dweight.narrow(0, v0, w.size(0)).addmm_(dz, h);
    });
    if (need_hidden) out.unit_grads.hidden.index_copy_(0, idx, dh);
  }
  out.sum = loss.mul_(coef).sum();
  if (need_weight) out.unit_grads.weight = dweight;
  return out;
}

}  // namespace ballast::kernels
