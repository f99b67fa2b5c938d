#include "kernels/causal_conv1d.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/gated_delta_rule_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using attention_reference::ExpectErrorMentions;
using gdr_reference::ConvForward;
using gdr_reference::CuSeqlens;
using gdr_reference::RelativeError;

enum class Path { kDispatched, kAten, kReference };

// y and the gradients of sum(y * dy): x, weight and (when given) the window.
std::vector<at::Tensor> RunWithGrads(const at::Tensor& x, const at::Tensor& w, const at::Tensor& cu,
                                     const at::Tensor& window, const at::Tensor& dy, Path path,
                                     at::ScalarType dtype) {
  const at::Tensor xl = x.detach().to(dtype).requires_grad_(true);
  const at::Tensor wl = w.detach().to(dtype).requires_grad_(true);
  const at::Tensor winl =
      window.defined() ? window.detach().to(dtype).requires_grad_(true) : at::Tensor();
  const at::Tensor y = path == Path::kReference ? ConvForward(xl, wl, cu, winl)
                       : path == Path::kAten    ? causal_conv1d_silu_aten(xl, wl, cu, winl)
                                                : causal_conv1d_silu(xl, wl, cu, winl);
  (y.to(torch::kDouble) * dy.to(torch::kDouble)).sum().backward();
  std::vector<at::Tensor> out = {y.detach(), xl.grad(), wl.grad()};
  if (window.defined()) out.push_back(winl.grad());
  return out;
}

class CausalConv1dTest : public SeededTest {};

// Both paths against the float64 reference: documents shorter than the window
// (1, 2), an empty one, channels that are not a multiple of the 8-lane
// vectors, 4 taps (Qwen3.5) and 2, with and without initial windows. One
// fp32 product of K terms and a sigmoid per value: 1e-6.
TEST_F(CausalConv1dTest, MatchesFloat64ReferenceWithGrads) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {1, 2, 0, 5, 130};
  const at::Tensor cu = CuSeqlens(lengths);
  for (int64_t taps : {4, 2}) {
    for (bool with_window : {false, true}) {
      const at::Tensor x = torch::randn({138, 37}, torch::kDouble);
      const at::Tensor w = torch::randn({37, taps}, torch::kDouble);
      const at::Tensor window =
          with_window ? torch::randn({5, 37, taps - 1}, torch::kDouble) : at::Tensor();
      const at::Tensor dy = torch::randn({138, 37}, torch::kDouble);
      const std::vector<at::Tensor> want =
          RunWithGrads(x, w, cu, window, dy, Path::kReference, torch::kDouble);
      for (Path path : {Path::kDispatched, Path::kAten}) {
        const std::vector<at::Tensor> got = RunWithGrads(x, w, cu, window, dy, path, torch::kFloat);
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_LT(RelativeError(got[i], want[i]), 1e-6)
              << "output " << i << ", taps " << taps << (with_window ? ", window" : "")
              << (path == Path::kAten ? ", aten" : ", cpu");
        }
      }
    }
  }
}

// Each document alone gives the bits of the packed row: nothing crosses a start.
TEST_F(CausalConv1dTest, PackedRowEqualsDocumentsAloneBitwise) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {3, 70, 1, 64};
  const at::Tensor x = torch::randn({138, 24});
  const at::Tensor w = torch::randn({24, 4});
  const at::Tensor window = torch::randn({4, 24, 3});
  const at::Tensor dy = torch::randn({138, 24});
  const std::vector<at::Tensor> whole =
      RunWithGrads(x, w, CuSeqlens(lengths), window, dy, Path::kDispatched, torch::kFloat);
  int64_t begin = 0;
  at::Tensor dw_sum = torch::zeros({24, 4}, torch::kDouble);
  for (size_t n = 0; n < lengths.size(); ++n) {
    const int64_t length = lengths[n];
    const std::vector<at::Tensor> one =
        RunWithGrads(x.narrow(0, begin, length), w, CuSeqlens({length}), window.narrow(0, n, 1),
                     dy.narrow(0, begin, length), Path::kDispatched, torch::kFloat);
    EXPECT_TRUE(torch::equal(whole[0].narrow(0, begin, length), one[0])) << "y, document " << n;
    EXPECT_TRUE(torch::equal(whole[1].narrow(0, begin, length), one[1])) << "dx, document " << n;
    EXPECT_TRUE(torch::equal(whole[3].narrow(0, n, 1), one[3])) << "dwindow, document " << n;
    dw_sum += one[2].to(torch::kDouble);
    begin += length;
  }
  // The weight's gradient sums over the documents, in another order: 1e-6.
  EXPECT_LT(RelativeError(whole[2], dw_sum), 1e-6);
}

// x as the strided view of a wider projection, and bf16: the kernel reads
// the strides; bf16 is computed in fp32 and rounded once (2^-9 relative), so
// against float64 of the same bf16 values 1e-2.
TEST_F(CausalConv1dTest, ReadsStridedViewsAndBf16) {
  SCOPED_TRACE(SeedTrace());
  const at::Tensor cu = CuSeqlens({40, 60});
  const at::Tensor wide = torch::randn({100, 80});
  const at::Tensor x = wide.narrow(1, 8, 64);
  const at::Tensor w = torch::randn({64, 4});
  EXPECT_TRUE(torch::equal(causal_conv1d_silu(x, w, cu, at::Tensor()),
                           causal_conv1d_silu(x.contiguous(), w, cu, at::Tensor())));
  const at::Tensor dy = torch::randn({100, 64});
  const at::Tensor xb = x.to(torch::kBFloat16), wb = w.to(torch::kBFloat16);
  const std::vector<at::Tensor> got =
      RunWithGrads(xb, wb, cu, at::Tensor(), dy, Path::kDispatched, torch::kBFloat16);
  const std::vector<at::Tensor> want =
      RunWithGrads(xb, wb, cu, at::Tensor(), dy, Path::kReference, torch::kDouble);
  EXPECT_EQ(got[0].scalar_type(), torch::kBFloat16);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_LT(RelativeError(got[i], want[i]), 1e-2) << i;
}

TEST_F(CausalConv1dTest, BadArgumentsThrowNamingTheArgument) {
  const at::Tensor x = torch::randn({10, 8}), w = torch::randn({8, 4});
  const at::Tensor cu = CuSeqlens({4, 6});
  ExpectErrorMentions([&] { causal_conv1d_silu(x.t(), w, cu, at::Tensor()); },
                      "x must have unit stride in C");
  ExpectErrorMentions(
      [&] {
        causal_conv1d_silu(x, torch::randn({7, 4}), cu, at::Tensor());
      },
      "weight must be (C, K) = (8");
  ExpectErrorMentions(
      [&] {
        causal_conv1d_silu(x, w, CuSeqlens({4, 5}), at::Tensor());
      },
      "cu_seqlens must end at T = 10");
  ExpectErrorMentions(
      [&] {
        causal_conv1d_silu(x, w, cu, torch::randn({2, 8, 4}));
      },
      "initial_window must be (N, C, K - 1) = (2, 8, 3)");
  ExpectErrorMentions([&] { causal_conv1d_silu(x.to(torch::kDouble), w, cu, at::Tensor()); },
                      "x must be float32 or bfloat16");
}

}  // namespace
}  // namespace ballast::kernels
