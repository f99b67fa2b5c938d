// SortByExpert against a direct stable bucketing of the (token, slot) pairs,
// on fresh random routings; the order it makes, composed with
// grouped_linear, against a per-token loop; and its errors.
#include "kernels/expert_order.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/grouped_linear.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

class ExpertOrdering : public SeededTest {};

// Distinct experts per token, as a top-k router picks them.
at::Tensor RandomRouting(int64_t tokens, int64_t top_k, int64_t experts) {
  return std::get<1>(torch::rand({tokens, experts}).topk(top_k, 1));
}

// Expert by expert, every slot routed to it in slot order.
void ExpectBucketed(const at::Tensor& selected, int64_t experts, const ExpertOrder& order) {
  const int64_t top_k = selected.size(1);
  const at::Tensor flat = selected.reshape({-1}).contiguous();
  const int64_t* ids = flat.data_ptr<int64_t>();
  std::vector<int64_t> slots, counts(experts, 0), offsets;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t s = 0; s < flat.numel(); ++s) {
      if (ids[s] == e) {
        slots.push_back(s);
        ++counts[e];
      }
    }
    offsets.push_back(static_cast<int64_t>(slots.size()));
  }
  ASSERT_EQ(order.slot.scalar_type(), torch::kLong);
  ASSERT_EQ(order.token.scalar_type(), torch::kLong);
  ASSERT_EQ(order.counts.scalar_type(), torch::kLong);
  ASSERT_EQ(order.offsets.scalar_type(), torch::kInt);
  EXPECT_TRUE(torch::equal(order.slot, torch::tensor(slots, torch::kLong)));
  EXPECT_TRUE(torch::equal(order.token, torch::tensor(slots, torch::kLong).div(top_k, "floor")));
  EXPECT_TRUE(torch::equal(order.counts, torch::tensor(counts, torch::kLong)));
  EXPECT_TRUE(torch::equal(order.offsets, torch::tensor(offsets, torch::kLong).to(torch::kInt)));
  // row inverts slot: slot s sits at sorted row r exactly when slots[r] == s.
  std::vector<int64_t> rows(slots.size());
  for (size_t r = 0; r < slots.size(); ++r) rows[slots[r]] = static_cast<int64_t>(r);
  EXPECT_TRUE(torch::equal(order.row, torch::tensor(rows, torch::kLong)));
}

TEST_F(ExpertOrdering, SortByExpertIsAStableBucketing) {
  SCOPED_TRACE(SeedTrace());
  for (const auto& [tokens, top_k, experts] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{500, 4, 16}, {37, 2, 8}, {1, 1, 1}}) {
    const at::Tensor selected = RandomRouting(tokens, top_k, experts);
    ExpectBucketed(selected, experts, SortByExpert(selected, experts));
  }
}

TEST_F(ExpertOrdering, SortByExpertWithEmptyExperts) {
  SCOPED_TRACE(SeedTrace());
  // 128 experts, tokens routed among 5 of them (ids may repeat across tokens).
  const at::Tensor used = torch::randperm(128).narrow(0, 0, 5);
  const at::Tensor selected = used.index({RandomRouting(300, 2, 5)});
  const ExpertOrder order = SortByExpert(selected, 128);
  ExpectBucketed(selected, 128, order);
  EXPECT_EQ(order.counts.eq(0).sum().item<int64_t>(), 123);
}

TEST_F(ExpertOrdering, NoTokens) {
  const ExpertOrder order = SortByExpert(torch::zeros({0, 2}, torch::kLong), 4);
  EXPECT_EQ(order.slot.numel(), 0);
  EXPECT_EQ(order.token.numel(), 0);
  EXPECT_TRUE(torch::equal(order.counts, torch::zeros({4}, torch::kLong)));
  EXPECT_TRUE(torch::equal(order.offsets, torch::zeros({4}, torch::kInt)));
}

TEST_F(ExpertOrdering, ErrorsNameTheArgument) {
  const auto expect_error = [](const at::Tensor& selected, int64_t experts,
                               const std::string& needle) {
    try {
      SortByExpert(selected, experts);
      ADD_FAILURE() << "no error; expected one naming " << needle;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const at::Tensor ok = torch::tensor({{0, 1}, {2, 3}}, torch::kLong);
  expect_error(ok, 3, "selected_experts must be in [0, num_experts = 3)");
  expect_error(ok - 1, 4, "selected_experts must be in [0, num_experts = 4)");
  expect_error(ok.to(torch::kInt), 4, "selected_experts must be int64");
  expect_error(ok.reshape({-1}), 4, "selected_experts must be (T, k)");
  expect_error(ok, 0, "num_experts must be >= 1");
}

TEST_F(ExpertOrdering, SortedRowsThroughGroupedLinearMatchAPerTokenLoop) {
  SCOPED_TRACE(SeedTrace());
  // The MoE layer's use: gather x by token, one grouped product, and each
  // sorted row equals its token through its own expert.
  const int64_t tokens = 64, top_k = 2, experts = 8, hidden = 16, out = 12;
  const at::Tensor selected = RandomRouting(tokens, top_k, experts);
  const at::Tensor x = torch::randn({tokens, hidden});
  const at::Tensor w = torch::randn({experts, out, hidden});
  const ExpertOrder order = SortByExpert(selected, experts);
  const at::Tensor y = grouped_linear(x.index_select(0, order.token), w, order.offsets);
  const at::Tensor flat = selected.reshape({-1});
  for (int64_t i = 0; i < tokens * top_k; ++i) {
    const int64_t slot = order.slot[i].item<int64_t>();
    const at::Tensor want = at::mv(w[flat[slot].item<int64_t>()], x[slot / top_k]);
    EXPECT_TRUE(torch::allclose(y[i], want, 1e-5, 1e-5)) << "row " << i << ", slot " << slot;
  }
}

}  // namespace
}  // namespace ballast::kernels
