// grad_norm: the global L2 norm of many tensors at once, in fp32, with the
// first tensor that holds a non-finite value.
//
// The trainer calls it once per optimizer step over every gradient (or every
// local shard of one). Per-tensor sums of squares are returned too, so that a
// sharded trainer all-reduces them and so that the guard can name the first
// module that went non-finite. Thread-compatible: no shared state.
#ifndef BALLAST_KERNELS_GRAD_NORM_H_
#define BALLAST_KERNELS_GRAD_NORM_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace ballast::kernels {

struct GradNormResult {
  // fp32 scalar on the tensors' device: sqrt(sum over tensors of sum(x^2)).
  at::Tensor norm;
  // fp64 [n]: sum(x^2) of each tensor, squared and accumulated in fp64 on CPU
  // and CUDA alike; fp64 because a gradient with |x| > 1.8e19 has a finite
  // fp32 norm but a sum of squares past fp32's range.
  at::Tensor sum_squares;
  // Index of the first tensor holding a NaN or an infinity; -1 when all are
  // finite, or when not looked for.
  int64_t first_nonfinite = -1;
};

// All tensors must be on one device, contiguous, of dtype fp32, bf16, fp16 or
// fp64. Undefined tensors are skipped (their sum_squares is 0). An empty list
// gives norm 0. With locate_nonfinite false, first_nonfinite is not looked
// for: on CUDA that spares the one read back to the host, and the caller can
// read it off sum_squares, whose entry is non-finite exactly when its tensor
// holds a non-finite value (fp64 sums of fp32, bf16 or fp16 squares cannot
// overflow).
GradNormResult grad_norm(const std::vector<at::Tensor>& tensors, bool locate_nonfinite = true);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_GRAD_NORM_H_
