// The three products as at::_grouped_mm calls:
//   forward       _grouped_mm(x, W^T, offsets)      2-D x 3-D, ragged rows
//   input grad    _grouped_mm(d_y, W, offsets)      2-D x 3-D, ragged rows
//   weight grad   _grouped_mm(d_y^T, x, offsets)    2-D x 2-D, ragged depth -> (E, out, in)
// W^T and d_y^T are views (column-major operands), never copies.
//
// bfloat16 on sm_90 and newer runs ATen's CUTLASS grouped kernel: one launch,
// fp32 accumulation, offsets read on the device (no host synchronisation), an
// expert with no rows a group of size 0. float32 is passed on as it is, to
// ATen's fallback, which runs one at::mm per expert after reading the offsets
// on the host: casting to bf16 instead would quietly give a caller who asked
// for fp32 a bf16 product. (bf16 before sm_90 takes the same fallback.)
//
// ATen's kernel needs 16-byte aligned base pointers and leading strides that
// are multiples of 16 bytes: in and out must be multiples of 8 (bf16) or 4
// (fp32) elements, which every released model's hidden and expert sizes are.
// Other sizes get an error that names them rather than a padded copy.
#include "kernels/cuda/grouped_linear_cuda.h"

#include <ATen/ATen.h>

#include <cstdint>

namespace ballast::kernels {
namespace {

// A contiguous operand whose base pointer meets the 16-byte rule.
at::Tensor Aligned(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

void CheckWidths(const char* what, int64_t out, int64_t in, const at::Tensor& t) {
  const int64_t multiple = 16 / static_cast<int64_t>(t.element_size());
  TORCH_CHECK(in % multiple == 0 && out % multiple == 0, "grouped_linear: ", what,
              " on CUDA needs in and out to be multiples of ", multiple, " for ", t.scalar_type(),
              " (ATen's grouped GEMM reads 16-byte rows), got out = ", out, ", in = ", in);
}

}  // namespace

at::Tensor grouped_linear_cuda_forward(const at::Tensor& x, const at::Tensor& weight,
                                       const at::Tensor& offsets) {
  CheckWidths("the forward", weight.size(1), weight.size(2), x);
  return at::_grouped_mm(Aligned(x), Aligned(weight).transpose(1, 2), offsets);
}

at::Tensor grouped_linear_cuda_input_grad(const at::Tensor& d_y, const at::Tensor& weight,
                                          const at::Tensor& offsets) {
  CheckWidths("the input gradient", weight.size(1), weight.size(2), d_y);
  return at::_grouped_mm(Aligned(d_y), Aligned(weight), offsets);
}

at::Tensor grouped_linear_cuda_weight_grad(const at::Tensor& d_y, const at::Tensor& x,
                                           const at::Tensor& offsets) {
  CheckWidths("the weight gradient", d_y.size(1), x.size(1), x);
  return at::_grouped_mm(Aligned(d_y).t(), Aligned(x), offsets);
}

}  // namespace ballast::kernels
