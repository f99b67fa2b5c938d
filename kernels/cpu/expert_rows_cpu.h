// CPU loops of kernels/expert_rows.h, threaded over tokens (the sums) or rows.
// row_of_slot (T k,) int64 is ExpertOrder::row; top_k is k. Nothing here
// checks the arguments again.
#ifndef BALLAST_KERNELS_CPU_EXPERT_ROWS_CPU_H_
#define BALLAST_KERNELS_CPU_EXPERT_ROWS_CPU_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::kernels {

// out[t] = sum over t's rows r in expert order of (weights[slot r] *) rows[r]:
// weights undefined sums the rows as they are (the gather's backward).
at::Tensor sum_rows_by_token_cpu(const at::Tensor& rows, const at::Tensor& weights,
                                 const at::Tensor& row_of_slot, int64_t top_k);

// The combine's backward for out's gradient d_out (T, H): d_rows[r] =
// weights[slot r] * d_out[token r] and d_weights[slot r] = d_out[token r] . rows[r].
void combine_backward_cpu(const at::Tensor& d_out, const at::Tensor& rows,
                          const at::Tensor& weights, const at::Tensor& token,
                          const at::Tensor& slot, at::Tensor* d_rows, at::Tensor* d_weights);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_EXPERT_ROWS_CPU_H_
