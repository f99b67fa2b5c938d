#include "kernels/attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/cpu/attention_cpu.h"
#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using attention_reference::BlindRows;
using attention_reference::BlindRowsMask;
using attention_reference::BlockDiffusion;
using attention_reference::Causal;
using attention_reference::CausalRowsReference;
using attention_reference::ExpectCloseMaxNorm;
using attention_reference::ExpectErrorMentions;
using attention_reference::Grads;
using attention_reference::Inputs;
using attention_reference::RandomInputs;
using attention_reference::Reference;
using attention_reference::RelativeError;
using attention_reference::RunWithGrads;
using attention_reference::Total;

// Every test draws fresh inputs; the seed is printed with any failure.
class AttentionTest : public SeededTest {};

Grads KernelGrads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const AttentionMask& mask, double scale, const torch::Tensor& grad_out) {
  return RunWithGrads([&](auto& a, auto& b, auto& c) { return attention(a, b, c, mask, scale); }, q,
                      k, v, grad_out);
}

Grads ReferenceGrads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const AttentionMask& mask, double scale, const torch::Tensor& grad_out) {
  return RunWithGrads([&](auto& a, auto& b, auto& c) { return Reference(a, b, c, mask, scale); },
                      q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), grad_out);
}

// fp32 inputs are exact in float64, so the kernel's only error is fp32
// rounding in sums of at most a few hundred terms of size ~1: about
// sqrt(n) * 2^-24 ~ 1e-6 of the output's scale; 2e-5 leaves room for the
// longest (D = 256) dot products.
constexpr double kFp32Tol = 2e-5;
// bf16 inputs are exact in float64 too; the kernel computes in fp32 and
// rounds each result once to bf16 (8 bits: 2^-8 relative).
constexpr double kBf16Tol = 1.6e-2;
// fp16 rounds the result once to 11 bits (2^-11).
constexpr double kFp16Tol = 2e-3;

// ---------------------------------------------------------------------------
// Causal, packed, GQA, head dims, dtypes
// ---------------------------------------------------------------------------

// Document lengths straddle the query and key tiles: one token, one query
// tile and a bit, one key tile and a bit, half a tile, exactly one tile.
const std::vector<int64_t> kUnevenDocs = {1, kAttnShortBlockM + 6, kAttnBlockN + 1,
                                          kAttnShortBlockM / 2, kAttnShortBlockM};

TEST_F(AttentionTest, CausalPackedGqaMatchesFloat64ReferenceInFp32) {
  SCOPED_TRACE(SeedTrace());
  const AttentionMask mask = Causal(kUnevenDocs);
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{4, 2}, {8, 1}}) {
    for (int64_t d : {8, 64, 128, 256}) {
      const Inputs in = RandomInputs(Total(kUnevenDocs), hq, hkv, d, torch::kFloat);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const std::string what =
          "Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d);
      ExpectCloseMaxNorm(KernelGrads(in.q, in.k, in.v, mask, scale, in.grad_out),
                         ReferenceGrads(in.q, in.k, in.v, mask, scale, in.grad_out), kFp32Tol,
                         what);
    }
  }
}

// Documents of kAttnLongSegment tokens or more are cut into kAttnBlockM-row
// query tiles, shorter ones into kAttnShortBlockM rows: one of each, the long
// one ending in a partial tile.
TEST_F(AttentionTest, TallAndShortQueryTilesMatchFloat64Reference) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> docs = {kAttnShortBlockM + 3, kAttnLongSegment + kAttnBlockM + 7};
  const AttentionMask mask = Causal(docs);
  const Inputs in = RandomInputs(Total(docs), 4, 2, 64, torch::kFloat);
  const double scale = 0.125;
  ExpectCloseMaxNorm(KernelGrads(in.q, in.k, in.v, mask, scale, in.grad_out),
                     ReferenceGrads(in.q, in.k, in.v, mask, scale, in.grad_out), kFp32Tol,
                     "long and short documents");
}

TEST_F(AttentionTest, CausalPackedGqaMatchesFloat64ReferenceInBf16AndFp16) {
  SCOPED_TRACE(SeedTrace());
  const AttentionMask mask = Causal(kUnevenDocs);
  for (auto [dtype, tol] :
       {std::pair<torch::Dtype, double>{torch::kBFloat16, kBf16Tol}, {torch::kHalf, kFp16Tol}}) {
    for (int64_t d : {64, 128}) {
      const Inputs in = RandomInputs(Total(kUnevenDocs), 4, 2, d, dtype);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const Grads got = KernelGrads(in.q, in.k, in.v, mask, scale, in.grad_out);
      EXPECT_EQ(got.out.scalar_type(), dtype);
      EXPECT_EQ(got.dq.scalar_type(), dtype);
      EXPECT_EQ(got.dk.scalar_type(), dtype);
      ExpectCloseMaxNorm(got, ReferenceGrads(in.q, in.k, in.v, mask, scale, in.grad_out), tol,
                         std::string(c10::toString(dtype)) + " D=" + std::to_string(d));
    }
  }
}

TEST_F(AttentionTest, Float64GradientsMatchCentralDifferences) {
  SCOPED_TRACE(SeedTrace());
  // fp64 inputs run the kernel in fp64, so finite differences can check it:
  // with step 1e-6 the central difference is exact to ~1e-10 of the scale.
  const AttentionMask mask = Causal({5, 11});
  const Inputs in = RandomInputs(16, 4, 2, 8, torch::kDouble);
  const double scale = 0.4;
  const Grads got = KernelGrads(in.q, in.k, in.v, mask, scale, in.grad_out);
  auto loss = [&](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return (attention(q, k, v, mask, scale) * in.grad_out).sum().item<double>();
  };
  constexpr double kStep = 1e-6;
  for (int which = 0; which < 3; ++which) {
    const torch::Tensor& x = which == 0 ? in.q : which == 1 ? in.k : in.v;
    const torch::Tensor& analytic = which == 0 ? got.dq : which == 1 ? got.dk : got.dv;
    torch::Tensor numeric = torch::zeros_like(x);
    auto flat = x.view(-1);
    for (int64_t e = 0; e < x.numel(); ++e) {
      const double saved = flat[e].item<double>();
      flat[e] = saved + kStep;
      const double up = loss(in.q, in.k, in.v);
      flat[e] = saved - kStep;
      const double down = loss(in.q, in.k, in.v);
      flat[e] = saved;
      numeric.view(-1)[e] = (up - down) / (2 * kStep);
    }
    EXPECT_LE(RelativeError(analytic, numeric), 1e-7) << "input " << which;
  }
}

// ---------------------------------------------------------------------------
// Sliding window, packing, empty documents
// ---------------------------------------------------------------------------

TEST_F(AttentionTest, SlidingWindowMatchesFloat64Reference) {
  SCOPED_TRACE(SeedTrace());
  // Windows from one token to more than a key tile, over a document longer
  // than a key tile.
  for (int64_t window : {int64_t{1}, int64_t{17}, kAttnShortBlockM - 1, kAttnBlockN + 20}) {
    const AttentionMask mask = Causal({kAttnBlockN + 44, 3, 220}, window);
    const Inputs in = RandomInputs(kAttnBlockN + 267, 4, 2, 32, torch::kFloat);
    ExpectCloseMaxNorm(KernelGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out),
                       ReferenceGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out), kFp32Tol,
                       "window " + std::to_string(window));
  }
}

TEST_F(AttentionTest, PackedDocumentsMatchEachDocumentAlone) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {37, kAttnBlockN + 88, 5, 129};
  const Inputs in = RandomInputs(Total(lengths), 4, 2, 64, torch::kFloat);
  const Grads packed = KernelGrads(in.q, in.k, in.v, Causal(lengths), 0.125, in.grad_out);
  int64_t begin = 0;
  for (int64_t n : lengths) {
    const Grads alone =
        KernelGrads(in.q.narrow(0, begin, n), in.k.narrow(0, begin, n), in.v.narrow(0, begin, n),
                    Causal({n}), 0.125, in.grad_out.narrow(0, begin, n));
    // The same tiles run in the same order; only BLAS's choice of code path
    // for differently aligned data may change the last bit.
    const Grads slice = {packed.out.narrow(0, begin, n), packed.dq.narrow(0, begin, n),
                         packed.dk.narrow(0, begin, n), packed.dv.narrow(0, begin, n)};
    ExpectCloseMaxNorm(slice, alone, 1e-6, "document at " + std::to_string(begin));
    begin += n;
  }
}

TEST_F(AttentionTest, EmptyDocumentsAndEmptyBatchAreAccepted) {
  SCOPED_TRACE(SeedTrace());
  const AttentionMask mask = Causal({0, 10, 0, 0, 40, 0});
  const Inputs in = RandomInputs(50, 2, 1, 16, torch::kFloat);
  ExpectCloseMaxNorm(KernelGrads(in.q, in.k, in.v, mask, 0.25, in.grad_out),
                     ReferenceGrads(in.q, in.k, in.v, mask, 0.25, in.grad_out), kFp32Tol,
                     "empty docs");

  const Inputs none = RandomInputs(0, 2, 1, 16, torch::kFloat);
  const Grads got = KernelGrads(none.q, none.k, none.v, Causal({}), 0.25, none.grad_out);
  EXPECT_EQ(got.out.sizes(), none.q.sizes());
  EXPECT_EQ(got.dk.sizes(), none.k.sizes());
}

// ---------------------------------------------------------------------------
// Block diffusion
// ---------------------------------------------------------------------------

TEST_F(AttentionTest, BlockDiffusionMatchesMaskBuiltFromDefinition) {
  SCOPED_TRACE(SeedTrace());
  // Halves of 5, 40 and kAttnShortBlockM + 30 tokens: blocks that do and do not
  // divide L, and a half that crosses a query tile.
  const std::vector<int64_t> lengths = {10, 80, 2 * (kAttnShortBlockM + 30)};
  for (int64_t block_size : {1, 3, 16, 64, 200}) {
    const AttentionMask mask = BlockDiffusion(lengths, block_size);
    const Inputs in = RandomInputs(Total(lengths), 4, 2, 32, torch::kFloat);
    ExpectCloseMaxNorm(KernelGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out),
                       ReferenceGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out), kFp32Tol,
                       "block_size " + std::to_string(block_size));
  }
}

// Each backward work item owns the rows it writes (a document, both halves of
// a block-diffusion one), so the gradients are the same bits whatever the
// thread count; an item that shared rows with another would race here.
TEST_F(AttentionTest, GradientsAreBitwiseTheSameForAnyThreadCount) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {2 * kAttnShortBlockM + 10, 40, 3 * kAttnShortBlockM};
  const Inputs in = RandomInputs(Total(lengths), 4, 2, 32, torch::kFloat);
  const int threads = at::get_num_threads();
  for (const AttentionMask& mask : {Causal(lengths), BlockDiffusion(lengths, 16)}) {
    at::set_num_threads(1);
    const Grads one = KernelGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out);
    at::set_num_threads(4);
    const Grads four = KernelGrads(in.q, in.k, in.v, mask, 0.2, in.grad_out);
    at::set_num_threads(threads);
    EXPECT_TRUE(torch::equal(one.out, four.out));
    EXPECT_TRUE(torch::equal(one.dq, four.dq));
    EXPECT_TRUE(torch::equal(one.dk, four.dk));
    EXPECT_TRUE(torch::equal(one.dv, four.dv));
  }
}

TEST_F(AttentionTest, BlockDiffusionCleanQueriesIgnoreNoisyTokens) {
  SCOPED_TRACE(SeedTrace());
  // Changing the noisy half must leave the clean half's output unchanged.
  const AttentionMask mask = BlockDiffusion({64}, 8);
  Inputs in = RandomInputs(64, 2, 2, 16, torch::kFloat);
  const auto before = attention(in.q, in.k, in.v, mask, 0.25);
  in.k.narrow(0, 0, 32).normal_();
  in.v.narrow(0, 0, 32).normal_();
  in.q.narrow(0, 0, 32).normal_();
  const auto after = attention(in.q, in.k, in.v, mask, 0.25);
  EXPECT_TRUE(torch::equal(before.narrow(0, 32, 32), after.narrow(0, 32, 32)));
  EXPECT_FALSE(torch::equal(before.narrow(0, 0, 32), after.narrow(0, 0, 32)));
}

// ---------------------------------------------------------------------------
// Rows that see no key (reachable only through a hand-built IntervalMask)
// ---------------------------------------------------------------------------

TEST_F(AttentionTest, RowsThatSeeNoKeyGiveZeroOutputAndZeroGradient) {
  SCOPED_TRACE(SeedTrace());
  // Segment [0, kSeen): row i sees [0, i] except rows 3 and kLate, which see
  // nothing (kLate in the second query tile). Segment [kSeen, kT): nobody
  // sees anything, so its tile has no work at all.
  constexpr int64_t kSeen = kAttnShortBlockM + 6;
  constexpr int64_t kLate = kAttnShortBlockM + 2;
  const BlindRows blind = BlindRowsMask(kAttnShortBlockM);
  const int64_t kT = blind.tokens;
  const IntervalMask& mask = blind.mask;
  const torch::Tensor& visible = blind.visible;
  const Inputs in = RandomInputs(kT, 2, 1, 16, torch::kFloat);
  const double scale = 0.25;
  const AttentionCpuForward fwd = attention_cpu_forward(in.q, in.k, in.v, mask, scale);
  const AttentionCpuGrads grads =
      attention_cpu_backward(in.grad_out, in.q, in.k, in.v, fwd.out, fwd.lse, mask, scale);

  const auto empty_rows =
      torch::tensor(std::vector<int64_t>{3, kLate, kSeen, kSeen + 5, kT - 1}, torch::kLong);
  EXPECT_TRUE(torch::all(fwd.out.index_select(0, empty_rows) == 0).item<bool>());
  EXPECT_TRUE(
      torch::all(fwd.lse.index_select(1, empty_rows) == -std::numeric_limits<float>::infinity())
          .item<bool>());
  EXPECT_TRUE(torch::all(grads.q.index_select(0, empty_rows) == 0).item<bool>());
  for (const auto& t : {fwd.out, grads.q, grads.k, grads.v}) {
    EXPECT_TRUE(torch::isfinite(t).all().item<bool>());
  }

  std::vector<int64_t> cu = {0, kT};
  auto reference = [&](auto& q, auto& k, auto& v) {
    return Reference(
        q, k, v, cu, [&](int64_t, int64_t) { return visible; }, scale);
  };
  const Grads want = RunWithGrads(reference, in.q.to(torch::kDouble), in.k.to(torch::kDouble),
                                  in.v.to(torch::kDouble), in.grad_out);
  ExpectCloseMaxNorm({fwd.out, grads.q, grads.k, grads.v}, want, kFp32Tol, "hand-built mask");
}

// ---------------------------------------------------------------------------
// Long sequences: offsets past 2^15, 2^16, 2^17 tokens and T^2 past 2^31.
// ---------------------------------------------------------------------------

// Distinct rows to check: the ends, the tile edges, each side of the powers
// of two, and a few random ones.
std::vector<int64_t> SampleRows(int64_t tokens) {
  std::vector<int64_t> rows = {
      0, 1, kAttnBlockM - 1, kAttnBlockM, kAttnBlockN - 1, kAttnBlockN, tokens - 2, tokens - 1};
  for (int64_t p : {int64_t{1} << 15, int64_t{1} << 16, int64_t{1} << 17, int64_t{46341}}) {
    for (int64_t r : {p - 1, p, p + 1}) {
      if (r < tokens) rows.push_back(r);
    }
  }
  for (int i = 0; i < 8; ++i) rows.push_back(torch::randint(tokens, {1}).item<int64_t>());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

class AttentionLongTest : public AttentionTest, public ::testing::WithParamInterface<int64_t> {};

TEST_P(AttentionLongTest, CausalForwardMatchesChunkedReference) {
  SCOPED_TRACE(SeedTrace());
  const int64_t tokens = GetParam();
  // GQA (Hq = 2, Hkv = 1) up to 2^16 + 1 tokens; one head at 2^17, where the
  // quadratic work would otherwise take most of a minute on two cores.
  const int64_t heads = tokens > 65537 ? 1 : 2;
  const Inputs in = RandomInputs(tokens, heads, 1, 8, torch::kFloat);
  const auto out = attention(in.q, in.k, in.v, Causal({tokens}), 0.35);
  const std::vector<int64_t> rows = SampleRows(tokens);
  const auto want = CausalRowsReference(in.q.to(torch::kDouble), in.k.to(torch::kDouble),
                                        in.v.to(torch::kDouble), rows, 0.35);
  const auto got = out.index_select(0, torch::tensor(rows, torch::kLong));
  // Sums over up to 2^17 keys in fp32: sqrt(n) * 2^-24 is ~2e-5 at worst.
  EXPECT_LE(RelativeError(got, want), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Tokens, AttentionLongTest,
                         ::testing::Values(46341, 65535, 65536, 65537, 131072));

TEST_F(AttentionTest, LongCausalBackwardMatchesChunkedReference) {
  SCOPED_TRACE(SeedTrace());
  // The upstream gradient is non-zero on the sampled rows only, so the exact
  // float64 gradients are cheap to get, and all of dQ, dK and dV (every row)
  // is compared; the kernel still runs every tile.
  constexpr int64_t kTokens = 65537;
  const double scale = 0.35;
  const Inputs in = RandomInputs(kTokens, 1, 1, 8, torch::kFloat);
  const std::vector<int64_t> rows = SampleRows(kTokens);
  const auto row_index = torch::tensor(rows, torch::kLong);
  const auto row_grad = torch::randn({static_cast<int64_t>(rows.size()), 1, 8});
  const auto grad_out = torch::zeros_like(in.q).index_put_({row_index}, row_grad);
  const Grads got = KernelGrads(in.q, in.k, in.v, Causal({kTokens}), scale, grad_out);

  auto q = in.q.to(torch::kDouble).requires_grad_(true);
  auto k = in.k.to(torch::kDouble).requires_grad_(true);
  auto v = in.v.to(torch::kDouble).requires_grad_(true);
  auto sampled = CausalRowsReference(q, k, v, rows, scale);
  (sampled * grad_out.to(torch::kDouble).index_select(0, row_index)).sum().backward();
  EXPECT_LE(RelativeError(got.dq, q.grad()), 1e-4);
  EXPECT_LE(RelativeError(got.dk, k.grad()), 1e-4);
  EXPECT_LE(RelativeError(got.dv, v.grad()), 1e-4);
}

// ---------------------------------------------------------------------------
// Argument errors
// ---------------------------------------------------------------------------

TEST_F(AttentionTest, RejectsInconsistentArgumentsNamingThem) {
  const Inputs in = RandomInputs(10, 4, 2, 8, torch::kFloat);
  const AttentionMask ok = Causal({4, 6});
  auto run = [](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                const AttentionMask& mask) { return [=] { attention(q, k, v, mask, 0.5); }; };
  ExpectErrorMentions(run(in.q.view({10, 32}), in.k, in.v, ok), "q must be (T, Hq, D)");
  ExpectErrorMentions(run(in.q, in.k.narrow(0, 0, 9), in.v.narrow(0, 0, 9), ok),
                      "k must have q's T");
  ExpectErrorMentions(run(in.q, in.k, in.v.narrow(2, 0, 4).contiguous(), ok),
                      "v must have k's sizes");
  ExpectErrorMentions(run(in.q, torch::randn({10, 3, 8}), torch::randn({10, 3, 8}), ok),
                      "must be a multiple of Hkv");
  ExpectErrorMentions(
      run(torch::randn({10, 4, 300}), torch::randn({10, 2, 300}), torch::randn({10, 2, 300}), ok),
      "head dim D must be in [1, 256]");
  ExpectErrorMentions(run(in.q, in.k.to(torch::kDouble), in.v, ok), "k and v must have q's dtype");
  ExpectErrorMentions(run(in.q.to(torch::kInt), in.k, in.v, ok), "q must be fp32");
  ExpectErrorMentions(run(in.q.transpose(0, 1).contiguous().transpose(0, 1), in.k, in.v, ok),
                      "q must be contiguous");
  ExpectErrorMentions(run(in.q, in.k, in.v, Causal({4, 5})), "cu_seqlens must end at T = 10");
  AttentionMask descending = ok;
  descending.cu_seqlens = torch::tensor(std::vector<int64_t>{0, 7, 4, 10}, torch::kLong);
  ExpectErrorMentions(run(in.q, in.k, in.v, descending), "cu_seqlens must be non-decreasing");
  AttentionMask offset = ok;
  offset.cu_seqlens = torch::tensor(std::vector<int64_t>{1, 10}, torch::kLong);
  ExpectErrorMentions(run(in.q, in.k, in.v, offset), "cu_seqlens must start at 0");
  AttentionMask int32 = ok;
  int32.cu_seqlens = ok.cu_seqlens.to(torch::kInt);
  ExpectErrorMentions(run(in.q, in.k, in.v, int32), "cu_seqlens must be a non-empty 1-D int64");
  ExpectErrorMentions(run(in.q, in.k, in.v, Causal({4, 6}, -1)), "window must be >= 0");
  ExpectErrorMentions(run(in.q, in.k, in.v, BlockDiffusion({3, 7}, 2)), "odd length 3");
  ExpectErrorMentions(run(in.q, in.k, in.v, BlockDiffusion({4, 6}, 0)), "block_size must be >= 1");
  ExpectErrorMentions([&] { attention(in.q, in.k, in.v, ok, std::nan("")); },
                      "scale must be finite");
}

}  // namespace
}  // namespace ballast::kernels
