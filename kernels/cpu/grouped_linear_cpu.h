// CPU implementation of kernels/grouped_linear.h: the forward product and the
// two products of its backward. grouped_linear() validates the arguments
// (shapes, dtypes, offsets' values) and wraps these in autograd; nothing here
// checks them again.
//
// Each takes float32, float64 or bfloat16 operands of one dtype and returns
// that dtype; offsets is the (E,) int32 CPU tensor of cumulative row ends.
#ifndef BALLAST_KERNELS_CPU_GROUPED_LINEAR_CPU_H_
#define BALLAST_KERNELS_CPU_GROUPED_LINEAR_CPU_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

// x (N, in), weight (E, out, in) -> y (N, out): y_i = x_i . weight[e]^T.
at::Tensor grouped_linear_cpu_forward(const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& offsets);

// d_y (N, out), weight (E, out, in) -> d_x (N, in): d_x_i = d_y_i . weight[e].
at::Tensor grouped_linear_cpu_input_grad(const at::Tensor& d_y, const at::Tensor& weight,
                                         const at::Tensor& offsets);

// d_y (N, out), x (N, in) -> d_weight (E, out, in): d_weight[e] = d_y_e^T . x_e,
// zero for an expert with no rows.
at::Tensor grouped_linear_cpu_weight_grad(const at::Tensor& d_y, const at::Tensor& x,
                                          const at::Tensor& offsets);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_GROUPED_LINEAR_CPU_H_
