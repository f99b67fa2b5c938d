#include "worker/train/model/expert_exchange.h"

#include <torch/torch.h>

#include <numeric>

namespace ballast::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// rows -> AllToAll; its backward sends the gradient back the way the rows came.
struct AllToAllFunction : public torch::autograd::Function<AllToAllFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, Collectives* group,
                            const std::vector<int64_t>& recv_rows,
                            const std::vector<int64_t>& send_rows) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    ctx->saved_data["recv_rows"] = recv_rows;
    ctx->saved_data["send_rows"] = send_rows;
    return Exchange(group, input, recv_rows, send_rows);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* group = reinterpret_cast<Collectives*>(ctx->saved_data["group"].toInt());
    const std::vector<int64_t> recv_rows = ctx->saved_data["recv_rows"].toIntVector();
    const std::vector<int64_t> send_rows = ctx->saved_data["send_rows"].toIntVector();
    return {Exchange(group, grad_out[0], send_rows, recv_rows), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }

  static at::Tensor Exchange(Collectives* group, const at::Tensor& input,
                             const std::vector<int64_t>& recv_rows,
                             const std::vector<int64_t>& send_rows) {
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] = std::accumulate(recv_rows.begin(), recv_rows.end(), int64_t{0});
    at::Tensor output = at::empty(shape, input.options());
    group->AllToAll(output, input.contiguous(), recv_rows, send_rows);
    return output;
  }
};

}  // namespace

ExpertExchange::ExpertExchange(Collectives* group, const at::Tensor& counts) : group_(group) {
  torch::NoGradGuard no_grad;
  const int n = group->world_size();
  const int rank = group->rank();
  const int64_t experts = counts.numel();
  TORCH_CHECK(experts % n == 0, "ExpertExchange: ", experts, " experts do not split over ", n,
              " ranks");
  const int64_t local = experts / n;
  at::Tensor all = at::zeros({n, experts}, counts.options().dtype(at::kLong));
  all[rank].copy_(counts);
  group->SumInPlace(all);
  const at::Tensor host = all.cpu();
  const int64_t* c = host.const_data_ptr<int64_t>();  // c[p * E + e]: rank p's rows for e

  send_rows_.assign(n, 0);
  recv_rows_.assign(n, 0);
  for (int q = 0; q < n; ++q) {
    for (int64_t j = 0; j < local; ++j) {
      send_rows_[q] += c[rank * experts + q * local + j];
      recv_rows_[q] += c[q * experts + rank * local + j];
    }
  }
  // The received rows come rank by rank, each rank's expert by expert; the
  // grouped GEMMs want them expert by expert, each expert's rank by rank.
  std::vector<int64_t> start(n * local);  // where rank p's rows for local expert j arrive
  int64_t at = 0;
  for (int p = 0; p < n; ++p) {
    for (int64_t j = 0; j < local; ++j) {
      start[p * local + j] = at;
      at += c[p * experts + rank * local + j];
    }
  }
  std::vector<int64_t> sorted;
  sorted.reserve(at);
  std::vector<int32_t> ends(local);
  for (int64_t j = 0; j < local; ++j) {
    for (int p = 0; p < n; ++p) {
      const int64_t begin = start[p * local + j];
      for (int64_t r = 0; r < c[p * experts + rank * local + j]; ++r) sorted.push_back(begin + r);
    }
    ends[j] = static_cast<int32_t>(sorted.size());
  }
  std::vector<int64_t> unsorted(sorted.size());
  for (size_t i = 0; i < sorted.size(); ++i) unsorted[sorted[i]] = static_cast<int64_t>(i);
  const auto on = [&](auto& values, at::ScalarType dtype) {
    return torch::tensor(values, torch::TensorOptions().dtype(dtype)).to(counts.device());
  };
  sorted_ = on(sorted, at::kLong);
  unsorted_ = on(unsorted, at::kLong);
  local_offsets_ = on(ends, at::kInt);
}

at::Tensor ExpertExchange::Dispatch(const at::Tensor& rows) const {
  const at::Tensor received = AllToAllFunction::apply(rows, group_, recv_rows_, send_rows_);
  return received.index_select(0, sorted_);
}

at::Tensor ExpertExchange::Combine(const at::Tensor& local) const {
  return AllToAllFunction::apply(local.index_select(0, unsorted_), group_, send_rows_, recv_rows_);
}

}  // namespace ballast::train
