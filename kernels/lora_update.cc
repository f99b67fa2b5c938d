#include "kernels/lora_update.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <vector>

#include "kernels/cuda/grouped_linear_cuda.h"

namespace ballast::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where each B applies: to every row (dense), or per expert to the rows in
// expert order that end at offsets[e] (grouped). A CPU grouped update is one
// product per expert straight into its rows, the experts in parallel; on
// CUDA it is ATen's grouped GEMM (kernels/cuda/grouped_linear_cuda.h) and an
// add, as reading the offsets there would synchronise.
class Rows {
 public:
  explicit Rows(const at::Tensor& offsets) : offsets_(offsets) {
    if (!offsets.defined() || !offsets.device().is_cpu()) return;
    const at::Tensor ends = offsets.contiguous();
    starts_.push_back(0);
    for (int64_t e = 0; e < ends.numel(); ++e) starts_.push_back(ends.const_data_ptr<int32_t>()[e]);
  }

  bool grouped() const { return offsets_.defined(); }
  bool on_cpu() const { return !starts_.empty(); }

  // body(e, first row, rows) for every expert with rows, in parallel.
  template <typename Body>
  void ForEachExpert(const Body& body) const {
    const int64_t experts = static_cast<int64_t>(starts_.size()) - 1;
    at::parallel_for(0, experts, 1, [&](int64_t begin, int64_t end) {
      // Grad mode is per thread, and OpenMP's threads have it on: the
      // products here are the autograd function's own, recorded by no one.
      at::NoGradGuard no_grad;
      for (int64_t e = begin; e < end; ++e) {
        if (starts_[e + 1] > starts_[e]) body(e, starts_[e], starts_[e + 1] - starts_[e]);
      }
    });
  }

  // y += scaling * down @ B^T.
  void AddUpdate(at::Tensor y, const at::Tensor& down, const at::Tensor& up, double scaling) const {
    if (!grouped()) {
      y.addmm_(down, up.t(), /*beta=*/1, /*alpha=*/scaling);
    } else if (on_cpu()) {
      ForEachExpert([&](int64_t e, int64_t first, int64_t n) {
        y.narrow(0, first, n).addmm_(down.narrow(0, first, n), up[e].t(), 1, scaling);
      });
    } else {
      y.add_(grouped_linear_cuda_forward(down.contiguous(), up, offsets_), scaling);
    }
  }

  // d_down = scaling * dy @ B, into d_down (every row is written).
  void DownGrad(at::Tensor d_down, const at::Tensor& dy, const at::Tensor& up,
                double scaling) const {
    // beta = 0: the uninitialised destination is not read.
    if (!grouped()) {
      at::addmm_out(d_down, d_down, dy, up, /*beta=*/0, /*alpha=*/scaling);
    } else if (on_cpu()) {
      ForEachExpert([&](int64_t e, int64_t first, int64_t n) {
        at::Tensor rows = d_down.narrow(0, first, n);
        at::addmm_out(rows, rows, dy.narrow(0, first, n), up[e], 0, scaling);
      });
    } else {
      d_down.copy_(grouped_linear_cuda_input_grad(dy.contiguous(), up, offsets_)).mul_(scaling);
    }
  }

  // d_B = scaling * dy^T @ down (an expert without rows gets zeros).
  at::Tensor UpGrad(const at::Tensor& dy, const at::Tensor& down, const at::Tensor& up,
                    double scaling) const {
    if (!grouped()) {
      return at::addmm(at::empty(up.sizes(), up.options()), dy.t(), down, /*beta=*/0, scaling);
    }
    if (!on_cpu()) {
      return grouped_linear_cuda_weight_grad(dy.contiguous(), down.contiguous(), offsets_)
          .mul_(scaling);
    }
    at::Tensor d_up = at::zeros(up.sizes(), up.options());
    ForEachExpert([&](int64_t e, int64_t first, int64_t n) {
      at::Tensor d_e = d_up[e];
      at::addmm_out(d_e, d_e, dy.narrow(0, first, n).t(), down.narrow(0, first, n), 0, scaling);
    });
    return d_up;
  }

 private:
  at::Tensor offsets_;
  std::vector<int64_t> starts_;  // (E + 1) on CPU: expert e's rows are [starts[e], starts[e+1])
};

class LoraUpdateFunction : public torch::autograd::Function<LoraUpdateFunction> {
 public:
  // Arguments, in the order their gradients are returned: y, down, each B_i,
  // then out_begins, offsets (undefined when dense) and scaling (no gradient).
  static at::Tensor forward(AutogradContext* ctx, at::Tensor y, const at::Tensor& down,
                            at::TensorList ups, std::vector<int64_t> out_begins,
                            const std::optional<at::Tensor>& grouped_offsets, double scaling) {
    const at::Tensor offsets = grouped_offsets.value_or(at::Tensor());
    const Rows rows(offsets);
    int64_t rank_begin = 0;
    for (size_t i = 0; i < ups.size(); ++i) {
      const int64_t out = ups[i].size(-2), rank = ups[i].size(-1);
      rows.AddUpdate(y.narrow(1, out_begins[i], out), down.narrow(1, rank_begin, rank), ups[i],
                     scaling);
      rank_begin += rank;
    }
    ctx->mark_dirty({y});
    variable_list saved{down, offsets};
    saved.insert(saved.end(), ups.begin(), ups.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["out_begins"] = out_begins;
    ctx->saved_data["scaling"] = scaling;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& down = saved[0];
    const Rows rows(saved[1]);
    const std::vector<int64_t> out_begins = ctx->saved_data["out_begins"].toIntVector();
    const double scaling = ctx->saved_data["scaling"].toDouble();
    const at::Tensor& dy = grad_outputs[0];

    const size_t n = saved.size() - 2;
    at::Tensor d_down;
    if (ctx->needs_input_grad(1)) d_down = at::empty(down.sizes(), down.options());
    variable_list grads{dy, d_down};
    int64_t rank_begin = 0;
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& up = saved[2 + i];
      const int64_t out = up.size(-2), rank = up.size(-1);
      const at::Tensor dy_i = dy.narrow(1, out_begins[i], out);
      const at::Tensor down_i = down.narrow(1, rank_begin, rank);
      if (d_down.defined()) rows.DownGrad(d_down.narrow(1, rank_begin, rank), dy_i, up, scaling);
      grads.push_back(ctx->needs_input_grad(2 + i) ? rows.UpGrad(dy_i, down_i, up, scaling)
                                                   : at::Tensor());
      rank_begin += rank;
    }
    grads.push_back(at::Tensor());  // out_begins
    grads.push_back(at::Tensor());  // offsets
    grads.push_back(at::Tensor());  // scaling
    return grads;
  }
};

// Checks the shapes common to both forms; B_i is (out_i, r_i) or, grouped,
// (E, out_i, r_i).
void CheckShapes(const char* op, const at::Tensor& y, const at::Tensor& down,
                 const std::vector<at::Tensor>& ups, const std::vector<int64_t>& out_begins,
                 int64_t up_dims) {
  TORCH_CHECK(y.dim() == 2, op, ": y must be (T, sum out), got ", y.sizes());
  TORCH_CHECK(ups.size() == out_begins.size(), op, ": ", ups.size(), " adapters but ",
              out_begins.size(), " column offsets");
  int64_t ranks = 0;
  for (size_t i = 0; i < ups.size(); ++i) {
    TORCH_CHECK(ups[i].dim() == up_dims && out_begins[i] >= 0 &&
                    out_begins[i] + ups[i].size(-2) <= y.size(1),
                op, ": adapter ", i, " of sizes ", ups[i].sizes(), " at column ", out_begins[i],
                " does not fit y of sizes ", y.sizes());
    ranks += ups[i].size(-1);
  }
  TORCH_CHECK(down.dim() == 2 && down.size(0) == y.size(0) && down.size(1) == ranks, op,
              ": down must be (", y.size(0), ", ", ranks, "), got ", down.sizes());
}

}  // namespace

at::Tensor add_lora_update(const at::Tensor& y, const at::Tensor& down,
                           const std::vector<at::Tensor>& ups,
                           const std::vector<int64_t>& out_begins, double scaling) {
  CheckShapes("add_lora_update", y, down, ups, out_begins, 2);
  // As a TensorList, so that autograd sees each B as an input.
  return LoraUpdateFunction::apply(y, down, at::TensorList(ups), out_begins,
                                   std::optional<at::Tensor>(), scaling);
}

at::Tensor add_grouped_lora_update(const at::Tensor& y, const at::Tensor& down,
                                   const std::vector<at::Tensor>& ups,
                                   const std::vector<int64_t>& out_begins,
                                   const at::Tensor& offsets, double scaling) {
  CheckShapes("add_grouped_lora_update", y, down, ups, out_begins, 3);
  TORCH_CHECK(offsets.defined() && offsets.dim() == 1 && offsets.scalar_type() == at::kInt &&
                  offsets.device() == y.device(),
              "add_grouped_lora_update: offsets must be (E,) int32 on y's device");
  for (size_t i = 0; i < ups.size(); ++i) {
    TORCH_CHECK(ups[i].size(0) == offsets.size(0), "add_grouped_lora_update: adapter ", i, " has ",
                ups[i].size(0), " experts, offsets ", offsets.size(0));
  }
  if (offsets.device().is_cpu()) {
    // Every row of down's gradient is written by its expert's product: a
    // row no segment covers would be left uninitialised.
    const at::Tensor ends = offsets.contiguous();
    int64_t previous = 0;
    for (int64_t e = 0; e < ends.numel(); ++e) {
      const int64_t end = ends.const_data_ptr<int32_t>()[e];
      TORCH_CHECK(end >= previous,
                  "add_grouped_lora_update: offsets must be non-decreasing from 0, got [", e,
                  "] = ", end, " after ", previous);
      previous = end;
    }
    TORCH_CHECK(previous == y.size(0), "add_grouped_lora_update: offsets must end at y's ",
                y.size(0), " rows, got ", previous);
  }
  return LoraUpdateFunction::apply(y, down, at::TensorList(ups), out_begins,
                                   std::optional<at::Tensor>(offsets), scaling);
}

}  // namespace ballast::kernels
