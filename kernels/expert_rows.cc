// gather_expert_rows() and combine_expert_rows(): argument checks, the
// autograd wrappers, and the dispatch between the CPU loops and ATen ops.
#include "kernels/expert_rows.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "kernels/cpu/expert_rows_cpu.h"

namespace ballast::kernels {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The order's rows must be t's (gather: t's tokens times k), and t a dtype
// both paths run, so that a wrong pairing fails here rather than in the
// backward or by reading past a tensor.
void CheckOrder(const char* op, const ExpertOrder& order, const at::Tensor& t, int64_t rows) {
  TORCH_CHECK(order.token.defined() && order.slot.defined() && order.row.defined(), op,
              ": order must come from SortByExpert");
  TORCH_CHECK(order.token.numel() == rows && order.row.numel() == rows, op, ": the order has ",
              order.token.numel(), " rows, expected ", rows);
  const at::ScalarType dtype = t.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kDouble, op,
              ": must be float32, bfloat16 or float64, got ", dtype);
  TORCH_CHECK(order.token.device() == t.device(), op, ": order must be on ", t.device(), ", got ",
              order.token.device());
}

// Keeps the order's token and row; the backward sums each token's rows.
class GatherFunction : public torch::autograd::Function<GatherFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& token,
                            const at::Tensor& row, int64_t top_k) {
    ctx->save_for_backward({token, row});
    ctx->saved_data["top_k"] = top_k;
    ctx->saved_data["tokens"] = x.size(0);
    return x.index_select(0, token);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& d_rows = grad_outputs[0];
    at::Tensor d_x;
    if (d_rows.device().is_cpu()) {
      d_x = sum_rows_by_token_cpu(d_rows, at::Tensor(), saved[1], ctx->saved_data["top_k"].toInt());
    } else {
      d_x = at::zeros({ctx->saved_data["tokens"].toInt(), d_rows.size(1)}, d_rows.options())
                .index_add_(0, saved[0], d_rows);
    }
    return {d_x, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Keeps rows, weights and the order.
class CombineFunction : public torch::autograd::Function<CombineFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weights,
                            const at::Tensor& token, const at::Tensor& slot,
                            const at::Tensor& row) {
    ctx->save_for_backward({rows, weights, token, slot, row});
    if (rows.device().is_cpu()) {
      return sum_rows_by_token_cpu(rows, weights, row, weights.size(1));
    }
    const at::Tensor row_weights = weights.reshape({-1}).index_select(0, slot).unsqueeze(1);
    return at::zeros({weights.size(0), rows.size(1)}, rows.options())
        .index_add_(0, token, rows * row_weights);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weights = saved[1], &token = saved[2], &slot = saved[3];
    const at::Tensor& d_out = grad_outputs[0];
    at::Tensor d_rows, d_weights;
    const bool want_rows = ctx->needs_input_grad(0), want_weights = ctx->needs_input_grad(1);
    if (rows.device().is_cpu()) {
      combine_backward_cpu(d_out, rows, weights, token, slot, want_rows ? &d_rows : nullptr,
                           want_weights ? &d_weights : nullptr);
    } else {
      const at::Tensor g = d_out.index_select(0, token);
      if (want_rows) d_rows = g * weights.reshape({-1}).index_select(0, slot).unsqueeze(1);
      if (want_weights) {
        d_weights = at::zeros({weights.numel()}, weights.options())
                        .index_copy_(0, slot, (g * rows).sum(1))
                        .view(weights.sizes());
      }
    }
    return {d_rows, d_weights, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_expert_rows(const at::Tensor& x, const ExpertOrder& order) {
  TORCH_CHECK(x.defined() && x.dim() == 2, "gather_expert_rows: x must be (T, H), got ",
              x.defined() ? x.sizes() : at::IntArrayRef{});
  const int64_t n = order.token.defined() ? order.token.numel() : 0;
  const int64_t top_k = x.size(0) > 0 ? n / x.size(0) : 0;
  TORCH_CHECK(top_k * x.size(0) == n, "gather_expert_rows: the order has ", n,
              " rows, not a multiple of x's ", x.size(0), " tokens");
  CheckOrder("gather_expert_rows", order, x, n);
  return GatherFunction::apply(x, order.token, order.row, top_k);
}

at::Tensor combine_expert_rows(const at::Tensor& rows, const at::Tensor& weights,
                               const ExpertOrder& order) {
  TORCH_CHECK(rows.defined() && rows.dim() == 2, "combine_expert_rows: rows must be (T k, H), got ",
              rows.defined() ? rows.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weights.defined() && weights.dim() == 2 && weights.numel() == rows.size(0),
              "combine_expert_rows: weights must be (T, k) with T k = ", rows.size(0),
              " rows, got ", weights.defined() ? weights.sizes() : at::IntArrayRef{});
  TORCH_CHECK(weights.scalar_type() == rows.scalar_type(),
              "combine_expert_rows: weights must have rows' dtype ", rows.scalar_type(), ", got ",
              weights.scalar_type());
  CheckOrder("combine_expert_rows", order, rows, rows.size(0));
  return CombineFunction::apply(rows, weights, order.token, order.slot, order.row);
}

}  // namespace ballast::kernels
