#include "kernels/lora_update.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

namespace ballast::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LoraUpdateFunction : public torch::autograd::Function<LoraUpdateFunction> {
 public:
  // Arguments, in the order their gradients are returned: y, down, each B_i,
  // then out_begins and scaling (no gradient).
  static at::Tensor forward(AutogradContext* ctx, at::Tensor y, const at::Tensor& down,
                            at::TensorList ups, std::vector<int64_t> out_begins, double scaling) {
    int64_t rank_begin = 0;
    for (size_t i = 0; i < ups.size(); ++i) {
      const int64_t out = ups[i].size(0), rank = ups[i].size(1);
      y.narrow(1, out_begins[i], out)
          .addmm_(down.narrow(1, rank_begin, rank), ups[i].t(), /*beta=*/1, /*alpha=*/scaling);
      rank_begin += rank;
    }
    ctx->mark_dirty({y});
    variable_list saved{down};
    saved.insert(saved.end(), ups.begin(), ups.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["out_begins"] = out_begins;
    ctx->saved_data["scaling"] = scaling;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& down = saved[0];
    const std::vector<int64_t> out_begins = ctx->saved_data["out_begins"].toIntVector();
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const at::Tensor& dy = grad_outputs[0];

    const size_t n = saved.size() - 1;
    at::Tensor d_down;
    if (ctx->needs_input_grad(1)) d_down = at::empty(down.sizes(), down.options());
    variable_list grads{dy, d_down};
    int64_t rank_begin = 0;
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& up = saved[1 + i];
      const int64_t out = up.size(0), rank = up.size(1);
      const at::Tensor dy_i = dy.narrow(1, out_begins[i], out);
      const at::Tensor down_i = down.narrow(1, rank_begin, rank);
      // beta = 0: the uninitialised destination is not read.
      if (d_down.defined()) {
        at::Tensor d_down_i = d_down.narrow(1, rank_begin, rank);
        at::addmm_out(d_down_i, d_down_i, dy_i, up, /*beta=*/0, /*alpha=*/scaling);
      }
      at::Tensor d_up;
      if (ctx->needs_input_grad(2 + i)) {
        d_up = at::addmm(at::empty({out, rank}, up.options()), dy_i.t(), down_i, /*beta=*/0,
                         /*alpha=*/scaling);
      }
      grads.push_back(d_up);
      rank_begin += rank;
    }
    grads.push_back(at::Tensor());  // out_begins
    grads.push_back(at::Tensor());  // scaling
    return grads;
  }
};

}  // namespace

at::Tensor add_lora_update(const at::Tensor& y, const at::Tensor& down,
                           const std::vector<at::Tensor>& ups,
                           const std::vector<int64_t>& out_begins, double scaling) {
  TORCH_CHECK(y.dim() == 2, "add_lora_update: y must be (T, sum out), got ", y.sizes());
  TORCH_CHECK(ups.size() == out_begins.size(), "add_lora_update: ", ups.size(), " adapters but ",
              out_begins.size(), " column offsets");
  int64_t ranks = 0;
  for (size_t i = 0; i < ups.size(); ++i) {
    TORCH_CHECK(
        ups[i].dim() == 2 && out_begins[i] >= 0 && out_begins[i] + ups[i].size(0) <= y.size(1),
        "add_lora_update: adapter ", i, " of sizes ", ups[i].sizes(), " at column ", out_begins[i],
        " does not fit y of sizes ", y.sizes());
    ranks += ups[i].size(1);
  }
  TORCH_CHECK(down.dim() == 2 && down.size(0) == y.size(0) && down.size(1) == ranks,
              "add_lora_update: down must be (", y.size(0), ", ", ranks, "), got ", down.sizes());
  // As a TensorList, so that autograd sees each B as an input.
  return LoraUpdateFunction::apply(y, down, at::TensorList(ups), out_begins, scaling);
}

}  // namespace ballast::kernels
