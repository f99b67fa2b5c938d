// grouped_linear on CPU against a float64 loop of one at::mm per expert, for
// the output and both gradients, on fresh random inputs: routings with empty
// experts, one expert with every row, no rows at all, widths that are not
// multiples of the kernel's 256-wide tiles, and more than 2^16 rows. Also:
// the same bits at 1 and 2 threads, and errors that name the argument.
//
// Tolerance, relative (Frobenius): fp32 products with fp32 accumulation over
// depths up to ~600: 1e-5 (observed ~1e-7). bf16 results are rounded once to
// bf16 (relative step 2^-8) from fp32 sums of exactly representable bf16
// products: 5e-3.
#include "kernels/grouped_linear.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "kernels/expert_order.h"
#include "tests/unit/kernels/grouped_linear_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using grouped_linear_reference::Offsets;
using grouped_linear_reference::ProductsOf;
using grouped_linear_reference::Reference;
using grouped_linear_reference::RelativeError;
using grouped_linear_reference::RunKernel;

class GroupedLinear : public SeededTest {
 protected:
  // Checks output and gradients for `counts` rows per expert against the
  // float64 loop, in fp32 and bf16.
  void ExpectMatchesReference(const std::vector<int64_t>& counts, int64_t in, int64_t out) {
    int64_t rows = 0;
    for (int64_t c : counts) rows += c;
    const int64_t experts = static_cast<int64_t>(counts.size());
    const at::Tensor offsets = Offsets(counts);
    for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
      const at::Tensor x = torch::randn({rows, in}).to(dtype);
      const at::Tensor w = (torch::randn({experts, out, in}) / std::sqrt(in)).to(dtype);
      const at::Tensor dy = torch::randn({rows, out}).to(dtype);
      const ProductsOf got = RunKernel(x, w, offsets, dy);
      const ProductsOf want = Reference(x, w, offsets, dy);
      const double tolerance = dtype == torch::kFloat ? 1e-5 : 5e-3;
      const std::string where = std::string(c10::toString(dtype)) + ", " + std::to_string(experts) +
                                " experts, " + std::to_string(rows) + " rows, in " +
                                std::to_string(in) + ", out " + std::to_string(out);
      ASSERT_EQ(got.y.sizes(), (std::vector<int64_t>{rows, out})) << where;
      ASSERT_EQ(got.d_x.sizes(), x.sizes()) << where;
      ASSERT_EQ(got.d_w.sizes(), w.sizes()) << where;
      EXPECT_EQ(got.y.scalar_type(), dtype) << where;
      EXPECT_EQ(got.d_x.scalar_type(), dtype) << where;
      EXPECT_EQ(got.d_w.scalar_type(), dtype) << where;
      EXPECT_LT(RelativeError(got.y, want.y), tolerance) << "y, " << where;
      EXPECT_LT(RelativeError(got.d_x, want.d_x), tolerance) << "d_x, " << where;
      EXPECT_LT(RelativeError(got.d_w, want.d_w), tolerance) << "d_w, " << where;
      // An expert with no rows has exactly zero gradient, not a tiny one.
      for (int64_t e = 0; e < experts; ++e) {
        if (counts[e] == 0) {
          EXPECT_EQ(got.d_w[e].abs().max().item<double>(), 0.0) << "expert " << e << ", " << where;
        }
      }
    }
  }
};

// Rows per expert of `tokens` tokens each routed to `top_k` distinct experts
// drawn from the first `used` of `experts`.
std::vector<int64_t> RoutedCounts(int64_t tokens, int64_t top_k, int64_t experts, int64_t used) {
  const at::Tensor pick = std::get<1>(torch::rand({tokens, used}).topk(top_k, 1));
  const at::Tensor ids = torch::randperm(experts).narrow(0, 0, used).index({pick});
  const at::Tensor counts = SortByExpert(ids, experts).counts;
  return std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + experts);
}

TEST_F(GroupedLinear, EightExpertsTopTwo) {
  SCOPED_TRACE(SeedTrace());
  // out 300 crosses the 256-column tile; in 72 is no multiple of anything.
  ExpectMatchesReference(RoutedCounts(300, 2, 8, 8), 72, 300);
}

TEST_F(GroupedLinear, ManyExpertsMostlyEmpty) {
  SCOPED_TRACE(SeedTrace());
  ExpectMatchesReference(RoutedCounts(200, 2, 128, 10), 40, 24);
}

TEST_F(GroupedLinear, OneExpertTakesEveryRow) {
  SCOPED_TRACE(SeedTrace());
  // 600 rows cross two row tiles; the other experts have none, first and last included.
  ExpectMatchesReference({0, 600, 0, 0}, 33, 65);
  ExpectMatchesReference({0, 0, 0, 70}, 16, 8);
}

TEST_F(GroupedLinear, NoRows) {
  SCOPED_TRACE(SeedTrace());
  ExpectMatchesReference({0, 0, 0}, 16, 8);
}

TEST_F(GroupedLinear, WidthsOfOne) {
  SCOPED_TRACE(SeedTrace());
  ExpectMatchesReference({3, 0, 5}, 1, 1);
}

TEST_F(GroupedLinear, PastTwoToTheSixteenRows) {
  SCOPED_TRACE(SeedTrace());
  // Forward only: 70,000 rows over 8 experts, one of them over 2^16 alone.
  const std::vector<int64_t> counts = {5, 66000, 0, 1000, 2000, 0, 995, 0};
  const at::Tensor offsets = Offsets(counts);
  const at::Tensor x = torch::randn({70000, 24});
  const at::Tensor w = torch::randn({8, 40, 24});
  const at::Tensor y = grouped_linear(x, w, offsets);
  const at::Tensor want = Reference(x, w, offsets, at::Tensor()).y;
  EXPECT_LT(RelativeError(y, want), 1e-5);
}

TEST_F(GroupedLinear, Float64MatchesToRounding) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> counts = {7, 0, 300, 12};
  const at::Tensor offsets = Offsets(counts);
  const at::Tensor x = torch::randn({319, 50}, torch::kDouble);
  const at::Tensor w = torch::randn({4, 270, 50}, torch::kDouble);
  const at::Tensor dy = torch::randn({319, 270}, torch::kDouble);
  const ProductsOf got = RunKernel(x, w, offsets, dy), want = Reference(x, w, offsets, dy);
  EXPECT_EQ(got.y.scalar_type(), torch::kDouble);
  EXPECT_LT(RelativeError(got.y, want.y), 1e-13);
  EXPECT_LT(RelativeError(got.d_x, want.d_x), 1e-13);
  EXPECT_LT(RelativeError(got.d_w, want.d_w), 1e-13);
}

TEST_F(GroupedLinear, SameBitsAtAnyThreadCount) {
  SCOPED_TRACE(SeedTrace());
  // Enough tiles for both threads: out 520 and in 300 cross the tile edges,
  // and expert 2's 900 rows make four row tiles.
  const std::vector<int64_t> counts = {100, 0, 900, 37, 263};
  const at::Tensor offsets = Offsets(counts);
  const at::Tensor x = torch::randn({1300, 300});
  const at::Tensor w = torch::randn({5, 520, 300});
  const at::Tensor dy = torch::randn({1300, 520});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const ProductsOf one = RunKernel(x, w, offsets, dy);
  at::set_num_threads(2);
  const ProductsOf two = RunKernel(x, w, offsets, dy);
  at::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(one.y, two.y));
  EXPECT_TRUE(torch::equal(one.d_x, two.d_x));
  EXPECT_TRUE(torch::equal(one.d_w, two.d_w));
}

TEST_F(GroupedLinear, GradientOnlyWhereAsked) {
  SCOPED_TRACE(SeedTrace());
  const at::Tensor offsets = Offsets({4, 6});
  const at::Tensor x = torch::randn({10, 8}).requires_grad_(true);
  const at::Tensor w = torch::randn({2, 16, 8});
  // A non-contiguous upstream gradient: the transpose of a (16, 10) tensor.
  const at::Tensor dy = torch::randn({16, 10}).t();
  grouped_linear(x, w, offsets).backward(dy);
  const at::Tensor want = Reference(x.detach(), w, offsets, dy.contiguous()).d_x;
  EXPECT_LT(RelativeError(x.grad(), want), 1e-5);
  EXPECT_FALSE(w.grad().defined());
}

// Runs `call` and expects a c10::Error whose message contains `needle`.
template <typename Call>
void ExpectErrorNaming(const Call& call, const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GroupedLinearErrors, NameTheArgument) {
  const at::Tensor x = torch::randn({6, 4});
  const at::Tensor w = torch::randn({2, 3, 4});
  const at::Tensor offsets = Offsets({2, 4});
  ExpectErrorNaming([&] { grouped_linear(x.view({6, 2, 2}), w, offsets); }, "x must be (N, in)");
  ExpectErrorNaming([&] { grouped_linear(x, w[0], offsets); }, "weight must be (E, out, in)");
  ExpectErrorNaming([&] { grouped_linear(x, torch::randn({2, 3, 5}), offsets); }, "weight's in");
  ExpectErrorNaming([&] { grouped_linear(x, w, Offsets({6})); }, "offsets must be (E,)");
  ExpectErrorNaming([&] { grouped_linear(x, w, offsets.to(torch::kLong)); },
                    "offsets must be int32");
  ExpectErrorNaming(
      [&] {
        grouped_linear(x, w, torch::tensor({6, 4}, torch::kInt));
      },
      "non-decreasing");
  ExpectErrorNaming([&] { grouped_linear(x, w, Offsets({2, 3})); }, "offsets must end at N = 6");
  ExpectErrorNaming([&] { grouped_linear(x.to(torch::kHalf), w.to(torch::kHalf), offsets); },
                    "x must be float32 or bfloat16");
  ExpectErrorNaming([&] { grouped_linear(x, w.to(torch::kDouble), offsets); },
                    "weight must have x's dtype");
}

}  // namespace
}  // namespace ballast::kernels
