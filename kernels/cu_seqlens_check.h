// The check of a packed batch's document offsets, shared by the varlen
// kernels whose only structure is cu_seqlens (gated_delta_rule,
// causal_conv1d_silu).
#ifndef BALLAST_KERNELS_CU_SEQLENS_CHECK_H_
#define BALLAST_KERNELS_CU_SEQLENS_CHECK_H_

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>

namespace ballast::kernels {

// Throws a c10::Error that starts with `op` and names cu_seqlens unless it is
// a 1-D int64 CPU tensor of N + 1 >= 2 non-decreasing offsets from 0 to
// `tokens`. Returns N.
inline int64_t CheckCuSeqlens(const char* op, const at::Tensor& cu_seqlens, int64_t tokens) {
  TORCH_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 1 && cu_seqlens.numel() >= 2 &&
                  cu_seqlens.scalar_type() == at::kLong && cu_seqlens.device().is_cpu(),
              op, ": cu_seqlens must be a 1-D int64 CPU tensor of N + 1 >= 2 offsets");
  const at::Tensor cu = cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  const int64_t docs = cu.numel() - 1;
  TORCH_CHECK(c[0] == 0, op, ": cu_seqlens must start at 0, got ", c[0]);
  TORCH_CHECK(c[docs] == tokens, op, ": cu_seqlens must end at T = ", tokens, ", got ", c[docs]);
  for (int64_t d = 0; d < docs; ++d) {
    TORCH_CHECK(c[d + 1] >= c[d], op, ": cu_seqlens must be non-decreasing, got [", d + 1,
                "] = ", c[d + 1], " < [", d, "] = ", c[d]);
  }
  return docs;
}

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CU_SEQLENS_CHECK_H_
