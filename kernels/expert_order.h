// The row order of a Mixture-of-Experts layer's grouped experts: the (token,
// slot) pairs a top-k router chose, sorted by expert, so that each expert's
// rows are one contiguous segment for kernels/grouped_linear.h.
#ifndef BALLAST_KERNELS_EXPERT_ORDER_H_
#define BALLAST_KERNELS_EXPERT_ORDER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ballast::kernels {

// Sorted rows are stable: within an expert, in token order (and slot order
// within a token), so the permutation, and every sum over it, is the same on
// every run.
struct ExpertOrder {
  at::Tensor token;    // (T*k,) int64: the token of each sorted row (index into x's rows)
  at::Tensor slot;     // (T*k,) int64: the flat index t*k + j of each sorted row into (T, k)
  at::Tensor row;      // (T*k,) int64: the sorted row of each slot t*k + j (slot's inverse)
  at::Tensor counts;   // (E,) int64: rows per expert
  at::Tensor offsets;  // (E,) int32: cumulative row ends, on the input's device
};

// selected_experts (T, k) int64 in [0, E), on any device; every tensor of the
// result is on its device. Rows of padding tokens are routed like any other
// (transformers routes padding too): which rows count is the caller's choice.
// Throws c10::Error naming selected_experts or num_experts when the rank,
// dtype or an expert id is wrong (the range check reads the ids on the host:
// one synchronisation on CUDA).
ExpertOrder SortByExpert(const at::Tensor& selected_experts, int64_t num_experts);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_EXPERT_ORDER_H_
