// SortByExpert(): a stable sort of the flat (T*k,) expert ids. The sort's
// permutation is the slot order; the token is slot / k.
#include "kernels/expert_order.h"

#include <ATen/ATen.h>

namespace ballast::kernels {

ExpertOrder SortByExpert(const at::Tensor& selected_experts, int64_t num_experts) {
  TORCH_CHECK(num_experts >= 1, "SortByExpert: num_experts must be >= 1, got ", num_experts);
  TORCH_CHECK(selected_experts.defined() && selected_experts.dim() == 2,
              "SortByExpert: selected_experts must be (T, k), got ",
              selected_experts.defined() ? selected_experts.sizes() : at::IntArrayRef{});
  TORCH_CHECK(selected_experts.scalar_type() == at::kLong,
              "SortByExpert: selected_experts must be int64, got ", selected_experts.scalar_type());
  const int64_t top_k = selected_experts.size(1);
  const at::Tensor flat = selected_experts.reshape({-1});
  if (flat.numel() > 0) {
    const bool in_range = at::logical_and(flat >= 0, flat < num_experts).all().item<bool>();
    TORCH_CHECK(
        in_range, "SortByExpert: selected_experts must be in [0, num_experts = ", num_experts,
        "), got values in [", flat.min().item<int64_t>(), ", ", flat.max().item<int64_t>(), "]");
  }
  ExpertOrder order;
  order.slot = std::get<1>(at::sort(flat, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  order.row = at::empty_like(order.slot)
                  .scatter_(0, order.slot, at::arange(order.slot.numel(), order.slot.options()));
  order.token = top_k > 0 ? at::floor_divide(order.slot, top_k) : order.slot.clone();
  order.counts = at::bincount(flat, /*weights=*/{}, num_experts);
  order.offsets = order.counts.cumsum(0).to(at::kInt);
  return order;
}

}  // namespace ballast::kernels
