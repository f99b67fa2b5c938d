// swiglu(): argument checks, the autograd wrapper for the fused CPU pass, and
// the op-by-op path for everything else.
#include "kernels/swiglu.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "kernels/cpu/swiglu_cpu.h"

namespace ballast::kernels {
namespace {

// Keeps gate_up for the backward, as silu and mul would keep gate, up and
// silu(gate) between them.
class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& gate_up) {
    ctx->save_for_backward({gate_up});
    return swiglu_cpu_forward(gate_up);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const at::Tensor& d_out = grad_outputs[0];
    return {swiglu_cpu_backward(gate_up, d_out.stride(1) == 1 ? d_out : d_out.contiguous())};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.defined() && gate_up.dim() == 2 && gate_up.size(1) % 2 == 0,
              "swiglu: gate_up must be (T, 2I), got ",
              gate_up.defined() ? gate_up.sizes() : at::IntArrayRef{});
  if (gate_up.device().is_cpu() && gate_up.scalar_type() == at::kFloat) {
    return SwiGluFunction::apply(gate_up.stride(1) == 1 ? gate_up : gate_up.contiguous());
  }
  const std::vector<at::Tensor> halves = gate_up.chunk(2, 1);
  return at::silu(halves[0]) * halves[1];
}

}  // namespace ballast::kernels
