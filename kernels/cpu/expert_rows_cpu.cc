#include "kernels/cpu/expert_rows_cpu.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace ballast::kernels {
namespace {

// Tokens (or rows) per task: enough that a task's rows amortise its start.
constexpr int64_t kGrain = 16;

}  // namespace

at::Tensor sum_rows_by_token_cpu(const at::Tensor& rows, const at::Tensor& weights,
                                 const at::Tensor& row_of_slot, int64_t top_k) {
  const at::Tensor in = rows.contiguous();
  const at::Tensor w = weights.defined() ? weights.contiguous() : at::Tensor();
  const at::Tensor inverse = row_of_slot.contiguous();
  const int64_t tokens = top_k > 0 ? inverse.numel() / top_k : 0, width = in.size(1);
  at::Tensor out = at::empty({tokens, width}, in.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, in.scalar_type(), "sum_rows_by_token_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* src = in.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.defined() ? w.const_data_ptr<scalar_t>() : nullptr;
    const int64_t* inv = inverse.const_data_ptr<int64_t>();
    scalar_t* dst = out.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, tokens, kGrain, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> slots(top_k);  // the token's slots, by their rows
      std::vector<acc_t> acc(width);
      for (int64_t t = begin; t < end; ++t) {
        for (int64_t j = 0; j < top_k; ++j) slots[j] = t * top_k + j;
        // Expert order is row order: sort the k slots by their rows.
        std::sort(slots.begin(), slots.end(),
                  [&](int64_t a, int64_t b) { return inv[a] < inv[b]; });
        std::fill(acc.begin(), acc.end(), acc_t(0));
        for (int64_t j = 0; j < top_k; ++j) {
          const scalar_t* row = src + inv[slots[j]] * width;
          if (wp == nullptr) {
            for (int64_t h = 0; h < width; ++h) acc[h] += static_cast<acc_t>(row[h]);
          } else {
            // Rounded to scalar_t as the product rows * weights was.
            const scalar_t weight = wp[slots[j]];
            for (int64_t h = 0; h < width; ++h)
              acc[h] += static_cast<acc_t>(static_cast<scalar_t>(row[h] * weight));
          }
        }
        scalar_t* o = dst + t * width;
        for (int64_t h = 0; h < width; ++h) o[h] = static_cast<scalar_t>(acc[h]);
      }
    });
  });
  return out;
}

void combine_backward_cpu(const at::Tensor& d_out, const at::Tensor& rows,
                          const at::Tensor& weights, const at::Tensor& token,
                          const at::Tensor& slot, at::Tensor* d_rows, at::Tensor* d_weights) {
  const at::Tensor g = d_out.contiguous(), in = rows.contiguous(), w = weights.contiguous();
  const at::Tensor tok = token.contiguous(), sl = slot.contiguous();
  const int64_t n = in.size(0), width = in.size(1);
  if (d_rows != nullptr) *d_rows = at::empty_like(in);
  if (d_weights != nullptr) *d_weights = at::empty_like(w);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, in.scalar_type(), "combine_backward_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* gp = g.const_data_ptr<scalar_t>();
    const scalar_t* rp = in.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    const int64_t* tp = tok.const_data_ptr<int64_t>();
    const int64_t* sp = sl.const_data_ptr<int64_t>();
    scalar_t* drp = d_rows != nullptr ? d_rows->mutable_data_ptr<scalar_t>() : nullptr;
    scalar_t* dwp = d_weights != nullptr ? d_weights->mutable_data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gr = gp + tp[r] * width;
        const scalar_t* row = rp + r * width;
        if (drp != nullptr) {
          const scalar_t weight = wp[sp[r]];
          scalar_t* dr = drp + r * width;
          for (int64_t h = 0; h < width; ++h) dr[h] = gr[h] * weight;
        }
        if (dwp != nullptr) {
          acc_t dot = 0;
          for (int64_t h = 0; h < width; ++h)
            dot += static_cast<acc_t>(gr[h]) * static_cast<acc_t>(row[h]);
          dwp[sp[r]] = static_cast<scalar_t>(dot);
        }
      }
    });
  });
}

}  // namespace ballast::kernels
