// gather_expert_rows and combine_expert_rows against their definitions in
// ATen ops (index_select, and index_add of the weighted rows, which adds a
// token's rows in expert order as transformers' loop does), forward and
// backward, on fresh random routings; the same bits at any thread count; and
// the errors.
#include "kernels/expert_rows.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

class ExpertRows : public SeededTest {};

struct Layer {
  at::Tensor x, rows, weights, selected;  // leaves x (T, H), rows (T k, H), weights (T, k)
  ExpertOrder order;
};

// A routing where the last of `experts` gets no token.
Layer RandomLayer(int64_t tokens, int64_t top_k, int64_t experts, int64_t width,
                  torch::Dtype dtype) {
  Layer l;
  l.selected = std::get<1>(torch::rand({tokens, experts - 1}).topk(top_k, 1));
  l.order = SortByExpert(l.selected, experts);
  l.x = torch::randn({tokens, width}).to(dtype).requires_grad_(true);
  l.rows = torch::randn({tokens * top_k, width}).to(dtype).requires_grad_(true);
  l.weights = torch::rand({tokens, top_k}).to(dtype).requires_grad_(true);
  return l;
}

// The combine as the MoE layer wrote it before: weighted rows index_add'ed.
at::Tensor CombineReference(const Layer& l) {
  const at::Tensor w = l.weights.reshape({-1}).index_select(0, l.order.slot).unsqueeze(1);
  return at::zeros({l.x.size(0), l.rows.size(1)}, l.rows.options())
      .index_add(0, l.order.token, l.rows * w);
}

double Tolerance(torch::Dtype dtype) { return dtype == torch::kDouble ? 1e-12 : 1e-5; }

TEST_F(ExpertRows, GatherAndCombineMatchTheirDefinitionsWithGradients) {
  SCOPED_TRACE(SeedTrace());
  for (const auto& [tokens, top_k, experts, width] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {300, 4, 17, 40}, {37, 1, 5, 9}, {64, 3, 9, 256}}) {
    for (torch::Dtype dtype : {torch::kDouble, torch::kFloat}) {
      SCOPED_TRACE(std::to_string(tokens) + " tokens, top-" + std::to_string(top_k) + ", " +
                   c10::toString(dtype));
      const Layer l = RandomLayer(tokens, top_k, experts, width, dtype);
      const double tol = Tolerance(dtype);

      const at::Tensor d_rows = torch::randn({tokens * top_k, width}).to(dtype);
      const at::Tensor gathered = gather_expert_rows(l.x, l.order);
      EXPECT_TRUE(torch::equal(gathered, l.x.index_select(0, l.order.token)));
      const at::Tensor d_x = torch::autograd::grad({gathered}, {l.x}, {d_rows})[0];
      const at::Tensor want_d_x =
          torch::autograd::grad({l.x.index_select(0, l.order.token)}, {l.x}, {d_rows})[0];
      EXPECT_TRUE(torch::allclose(d_x, want_d_x, tol, tol)) << "d_x";

      const at::Tensor d_out = torch::randn({tokens, width}).to(dtype);
      const at::Tensor got = combine_expert_rows(l.rows, l.weights, l.order);
      const at::Tensor want = CombineReference(l);
      // Each token's rows are added in expert order on both sides.
      EXPECT_TRUE(torch::equal(got, want)) << "out";
      const auto got_grads = torch::autograd::grad({got}, {l.rows, l.weights}, {d_out});
      const auto want_grads = torch::autograd::grad({want}, {l.rows, l.weights}, {d_out});
      EXPECT_TRUE(torch::allclose(got_grads[0], want_grads[0], tol, tol)) << "d_rows";
      EXPECT_TRUE(torch::allclose(got_grads[1], want_grads[1], tol, tol)) << "d_weights";
    }
  }
}

TEST_F(ExpertRows, Bf16MatchesTheFloat32SumOfTheRoundedProducts) {
  SCOPED_TRACE(SeedTrace());
  const Layer l = RandomLayer(50, 4, 8, 32, torch::kBFloat16);
  const at::Tensor got = combine_expert_rows(l.rows, l.weights, l.order);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  const at::Tensor w = l.weights.reshape({-1}).index_select(0, l.order.slot).unsqueeze(1);
  const at::Tensor products = (l.rows * w).to(torch::kFloat);  // rounded to bf16 first
  const at::Tensor want = at::zeros({50, 32}).index_add(0, l.order.token, products);
  EXPECT_TRUE(torch::allclose(got.to(torch::kFloat), want, 1e-2, 1e-2));
}

TEST_F(ExpertRows, SameBitsAtAnyThreadCount) {
  SCOPED_TRACE(SeedTrace());
  const Layer l = RandomLayer(2000, 8, 33, 64, torch::kFloat);
  const at::Tensor d_out = torch::randn({2000, 64});
  auto run = [&](int threads) {
    at::set_num_threads(threads);
    const at::Tensor out =
        combine_expert_rows(gather_expert_rows(l.x, l.order) * 2, l.weights, l.order);
    const auto g = torch::autograd::grad({out}, {l.x, l.weights}, {d_out});
    return std::vector<at::Tensor>{out, g[0], g[1]};
  };
  const int threads = at::get_num_threads();
  const std::vector<at::Tensor> one = run(1), many = run(std::max(2, threads));
  at::set_num_threads(threads);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(one[i], many[i])) << i;
}

TEST_F(ExpertRows, ErrorsNameTheArgument) {
  const Layer l = RandomLayer(10, 2, 4, 8, torch::kFloat);
  auto expect_error = [](const std::function<void()>& call, const std::string& what) {
    try {
      call();
      ADD_FAILURE() << "no error, expected: " << what;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { gather_expert_rows(l.x.flatten(), l.order); }, "x must be (T, H)");
  expect_error([&] { gather_expert_rows(l.x.narrow(0, 0, 7), l.order); },
               "the order has 20 rows, not a multiple of x's 7 tokens");
  expect_error([&] { combine_expert_rows(l.rows, l.weights.narrow(0, 0, 9), l.order); },
               "weights must be (T, k) with T k = 20 rows");
  expect_error([&] { combine_expert_rows(l.rows, l.weights.to(torch::kDouble), l.order); },
               "weights must have rows' dtype");
  expect_error([&] { combine_expert_rows(l.rows, l.weights, ExpertOrder{}); },
               "order must come from SortByExpert");
  // rows and weights of 8 tokens with the order of 10: caught before any read.
  expect_error(
      [&] { combine_expert_rows(l.rows.narrow(0, 0, 16), l.weights.narrow(0, 0, 8), l.order); },
      "the order has 20 rows, expected 16");
  expect_error([&] { gather_expert_rows(l.x.to(torch::kHalf), l.order); },
               "must be float32, bfloat16 or float64");
}

}  // namespace
}  // namespace ballast::kernels
