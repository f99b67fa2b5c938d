// grouped_linear(): argument checks, the autograd wrapper, and the dispatch
// between the CPU kernel and ATen's grouped GEMM on CUDA.
#include "kernels/grouped_linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <limits>

#include "kernels/cpu/grouped_linear_cpu.h"
#include "kernels/cuda/grouped_linear_cuda.h"

namespace ballast::kernels {
namespace {

void CheckInputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& offsets) {
  TORCH_CHECK(x.defined() && x.dim() == 2, "grouped_linear: x must be (N, in), got ",
              x.defined() ? x.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weight.defined() && weight.dim() == 3 && weight.size(0) >= 1,
              "grouped_linear: weight must be (E, out, in) with E >= 1, got ",
              weight.defined() ? weight.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weight.size(2) == x.size(1), "grouped_linear: weight's in (", weight.size(2),
              ") must equal x's (", x.size(1), ")");
  const int64_t experts = weight.size(0);
  TORCH_CHECK(offsets.defined() && offsets.dim() == 1 && offsets.size(0) == experts,
              "grouped_linear: offsets must be (E,) = (", experts, ",), got ",
              offsets.defined() ? offsets.sizes() : at::IntArrayRef{});
  TORCH_CHECK(offsets.scalar_type() == at::kInt, "grouped_linear: offsets must be int32, got ",
              offsets.scalar_type());

  const at::Device device = x.device();
  TORCH_CHECK(device.is_cpu() || device.is_cuda(), "grouped_linear: x must be on CPU or CUDA, got ",
              device);
  TORCH_CHECK(weight.device() == device, "grouped_linear: weight must be on x's device ", device,
              ", got ", weight.device());
  TORCH_CHECK(offsets.device() == device, "grouped_linear: offsets must be on x's device ", device,
              ", got ", offsets.device());
  const at::ScalarType dtype = x.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kBFloat16 || (dtype == at::kDouble && device.is_cpu()),
      "grouped_linear: x must be float32 or bfloat16 (or float64 on CPU), got ", dtype);
  TORCH_CHECK(weight.scalar_type() == dtype, "grouped_linear: weight must have x's dtype ", dtype,
              ", got ", weight.scalar_type());

  if (!device.is_cpu()) return;  // reading the values would synchronise
  // BLAS takes int sizes and leading dimensions.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK(x.size(0) <= kIntMax && x.size(1) <= kIntMax && weight.size(1) <= kIntMax,
              "grouped_linear: x's N and in and weight's out must each be < 2^31 on CPU, got x ",
              x.sizes(), " and weight ", weight.sizes());
  const at::Tensor ends = offsets.contiguous();
  const int32_t* e = ends.const_data_ptr<int32_t>();
  int64_t previous = 0;
  for (int64_t i = 0; i < experts; ++i) {
    TORCH_CHECK(e[i] >= previous, "grouped_linear: offsets must be non-decreasing from 0, got [", i,
                "] = ", e[i], " after ", previous);
    previous = e[i];
  }
  TORCH_CHECK(previous == x.size(0), "grouped_linear: offsets must end at N = ", x.size(0),
              ", got ", previous);
}

// Keeps x, weight and offsets; the backward is the same grouped product twice.
class GroupedLinearFunction : public torch::autograd::Function<GroupedLinearFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& offsets) {
    ctx->save_for_backward({x, weight, offsets});
    return x.device().is_cpu() ? grouped_linear_cpu_forward(x, weight, offsets)
                               : grouped_linear_cuda_forward(x, weight, offsets);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &offsets = saved[2];
    const at::Tensor d_y = grad_outputs[0].contiguous();
    const bool cpu = x.device().is_cpu();
    at::Tensor d_x, d_weight;
    if (ctx->needs_input_grad(0)) {
      d_x = cpu ? grouped_linear_cpu_input_grad(d_y, weight, offsets)
                : grouped_linear_cuda_input_grad(d_y, weight, offsets);
    }
    if (ctx->needs_input_grad(1)) {
      d_weight = cpu ? grouped_linear_cpu_weight_grad(d_y, x, offsets)
                     : grouped_linear_cuda_weight_grad(d_y, x, offsets);
    }
    return {d_x, d_weight, at::Tensor()};
  }
};

}  // namespace

at::Tensor grouped_linear(const at::Tensor& x, const at::Tensor& weight,
                          const at::Tensor& offsets) {
  CheckInputs(x, weight, offsets);
  return GroupedLinearFunction::apply(x, weight, offsets);
}

}  // namespace ballast::kernels
