// Moving a Mixture-of-Experts layer's rows between token order and expert
// order (kernels/expert_order.h), as autograd functions:
//
//   gather_expert_rows(x (T, H), order) -> rows (T k, H),  rows[r] = x[token[r]]
//   combine_expert_rows(rows (T k, H), weights (T, k), order) -> (T, H),
//     out[t] = sum over t's k rows r, in expert order, of weights[slot[r]] * rows[r]
//
// The combine adds a token's rows in expert order, as transformers'
// loop over experts does (index_add_ per expert). Every backward is a gather
// too: a token's k rows are found through order.row, the inverse of the slot
// permutation, so on CPU no scatter-add runs (ATen's index_add walks its
// index on one thread) and no (T k, H) product of rows and weights is made;
// nothing depends on the thread count. Other devices run the same formulas
// in ATen ops (index_select, index_add).
#ifndef BALLAST_KERNELS_EXPERT_ROWS_H_
#define BALLAST_KERNELS_EXPERT_ROWS_H_

#include <ATen/core/Tensor.h>

#include "kernels/expert_order.h"

namespace ballast::kernels {

// x (T, H) float32, bfloat16 or float64; differentiable in x.
at::Tensor gather_expert_rows(const at::Tensor& x, const ExpertOrder& order);

// rows (T k, H) in expert order and weights (T, k) of rows' dtype;
// differentiable in both.
at::Tensor combine_expert_rows(const at::Tensor& rows, const at::Tensor& weights,
                               const ExpertOrder& order);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_EXPERT_ROWS_H_
