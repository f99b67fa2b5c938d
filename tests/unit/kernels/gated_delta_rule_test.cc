#include "kernels/gated_delta_rule.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "tests/unit/kernels/attention_reference.h"
#include "tests/unit/kernels/gated_delta_rule_reference.h"
#include "tests/unit/kernels/seeded_test.h"

namespace ballast::kernels {
namespace {

using attention_reference::ExpectErrorMentions;
using gdr_reference::Inputs;
using gdr_reference::RandomInputs;
using gdr_reference::RelativeError;

using GdrFunction = std::function<GatedDeltaRuleOutput(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, double, double)>;

const GdrFunction kDispatched =
    [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
       const at::Tensor& beta, const at::Tensor& cu, const at::Tensor& s, double scale,
       double eps) { return gated_delta_rule(q, k, v, g, beta, cu, s, scale, eps); };
const GdrFunction kAten = [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& g, const at::Tensor& beta, const at::Tensor& cu,
                             const at::Tensor& s, double scale, double eps) {
  return gated_delta_rule_aten(q, k, v, g, beta, cu, s, scale, eps);
};

// Outputs and the gradients of sum(out * d_out) + sum(final_state * d_final).
struct Result {
  at::Tensor out, final_state;
  at::Tensor dq, dk, dv, dg, dbeta, dstate;
};

Result RunWithGrads(const Inputs& in, const at::Tensor& d_out, const at::Tensor& d_final,
                    const GdrFunction& fn, at::ScalarType dtype) {
  auto leaf = [&](const at::Tensor& t, at::ScalarType type) {
    return t.defined() ? t.detach().to(type).clone().requires_grad_(true) : at::Tensor();
  };
  const at::ScalarType state_type = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
  at::Tensor q = leaf(in.q, dtype), k = leaf(in.k, dtype), v = leaf(in.v, dtype);
  at::Tensor g = leaf(in.g, state_type), beta = leaf(in.beta, state_type);
  at::Tensor s = leaf(in.initial_state, state_type);
  GatedDeltaRuleOutput o;
  if (dtype == torch::kDouble) {
    gdr_reference::Output r =
        gdr_reference::ForwardAutograd(q, k, v, g, beta, in.cu_seqlens, s, in.scale);
    o = {r.out, r.final_state};
  } else {
    o = fn(q, k, v, g, beta, in.cu_seqlens, s, in.scale, gdr_reference::kL2Eps);
  }
  const at::Tensor loss = (o.out.to(state_type) * d_out.to(state_type)).sum() +
                          (o.final_state * d_final.to(state_type)).sum();
  loss.backward();
  return {o.out.detach(), o.final_state.detach(),
          q.grad(),       k.grad(),
          v.grad(),       g.grad(),
          beta.grad(),    s.defined() ? s.grad() : at::Tensor()};
}

void ExpectGradsClose(const Result& got, const Result& want, double tolerance) {
  EXPECT_LT(RelativeError(got.out, want.out), tolerance) << "out";
  EXPECT_LT(RelativeError(got.final_state, want.final_state), tolerance) << "final_state";
  EXPECT_LT(RelativeError(got.dq, want.dq), tolerance) << "dq";
  EXPECT_LT(RelativeError(got.dk, want.dk), tolerance) << "dk";
  EXPECT_LT(RelativeError(got.dv, want.dv), tolerance) << "dv";
  EXPECT_LT(RelativeError(got.dg, want.dg), tolerance) << "dg";
  EXPECT_LT(RelativeError(got.dbeta, want.dbeta), tolerance) << "dbeta";
  if (want.dstate.defined()) {
    EXPECT_LT(RelativeError(got.dstate, want.dstate), tolerance) << "dstate";
  }
}

// fn's outputs and gradients against float64 autograd of the recurrence.
void ExpectMatchesFloat64Autograd(const std::vector<int64_t>& lengths, int64_t dk, int64_t dv,
                                  const GdrFunction& fn, double tolerance) {
  for (bool with_state : {false, true}) {
    const Inputs in = RandomInputs(lengths, 2, 4, dk, dv, with_state);
    const at::Tensor d_out = torch::randn({in.v.size(0), 4, dv});
    const at::Tensor d_final = torch::randn({static_cast<int64_t>(lengths.size()), 4, dk, dv});
    const Result want = RunWithGrads(in, d_out, d_final, kAten, torch::kDouble);
    const Result got = RunWithGrads(in, d_out, d_final, fn, torch::kFloat);
    SCOPED_TRACE(with_state ? "with initial state" : "zero initial state");
    ExpectGradsClose(got, want, tolerance);
  }
}

class GatedDeltaRuleTest : public SeededTest {};

// The op-by-op path against the float64 recurrence: lengths around the chunk
// of 64, several documents (one empty), grouped heads, with and without an
// initial state. fp32 chunked sums against float64: 2e-5 relative leaves room
// for the triangular solve's rounding over 64 rows.
TEST_F(GatedDeltaRuleTest, AtenPathMatchesFloat64RecurrenceWithGrads) {
  SCOPED_TRACE(SeedTrace());
  ExpectMatchesFloat64Autograd({1, 63, 0, 64, 65, 130}, 16, 8, kAten, 2e-5);
}

// The CPU kernel against the float64 recurrence at lengths around the chunk
// of 64 (and 0, whose final state is its initial one), one document each,
// grouped heads, with an initial state. The state is carried through up to
// 65 chunks; 1e-5 relative covers fp32's rounding of the chunk products and of
// the triangular inverse.
TEST_F(GatedDeltaRuleTest, CpuForwardMatchesFloat64RecurrenceAroundTheChunk) {
  SCOPED_TRACE(SeedTrace());
  for (int64_t length : {0, 1, 63, 64, 65, 4097}) {
    const Inputs in = RandomInputs({length}, 2, 4, 32, 16, /*with_state=*/true);
    const GatedDeltaRuleOutput got = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta,
                                                      in.cu_seqlens, in.initial_state, in.scale);
    const gdr_reference::Output want = gdr_reference::Forward(in);
    EXPECT_LT(RelativeError(got.out, want.out), 1e-5) << "T = " << length;
    EXPECT_LT(RelativeError(got.final_state, want.final_state), 1e-5) << "T = " << length;
  }
}

// 64k and 128k tokens, around a power of two of chunks, with small heads so
// that the float64 recurrence stays fast. g is scaled down so that the state
// remembers hundreds of tokens: an error that grew with the chunk count would
// show. Two documents in the longest row.
TEST_F(GatedDeltaRuleTest, CpuForwardMatchesFloat64RecurrenceAtLongLengths) {
  SCOPED_TRACE(SeedTrace());
  for (const std::vector<int64_t>& lengths :
       std::vector<std::vector<int64_t>>{{65535}, {65536}, {65537}, {131072}, {70000, 61072}}) {
    Inputs in = RandomInputs(lengths, 1, 2, 8, 8, /*with_state=*/false);
    in.g = in.g * 0.01;
    const GatedDeltaRuleOutput got = gated_delta_rule(in.q, in.k, in.v, in.g, in.beta,
                                                      in.cu_seqlens, in.initial_state, in.scale);
    const gdr_reference::Output want = gdr_reference::Forward(in);
    EXPECT_LT(RelativeError(got.out, want.out), 1e-5) << "T = " << in.q.size(0);
    EXPECT_LT(RelativeError(got.final_state, want.final_state), 1e-5) << "T = " << in.q.size(0);
  }
}

// Every gradient (q, k, v, g, beta, initial_state, through out and
// final_state) against float64 autograd of the recurrence: several documents
// across chunk edges (one empty), Hv = 2 Hk. fp32 against float64: 2e-5.
TEST_F(GatedDeltaRuleTest, CpuGradsMatchFloat64Autograd) {
  SCOPED_TRACE(SeedTrace());
  ExpectMatchesFloat64Autograd({5, 64, 0, 129, 70}, 16, 12, kDispatched, 2e-5);
}

// The op-by-op path and the CPU kernel compute the same chunks in different
// orders: outputs and gradients agree to fp32 rounding.
TEST_F(GatedDeltaRuleTest, AtenPathEqualsCpuKernel) {
  SCOPED_TRACE(SeedTrace());
  const Inputs in = RandomInputs({100, 3, 64, 150}, 2, 4, 32, 32, /*with_state=*/true);
  const at::Tensor d_out = torch::randn({in.v.size(0), 4, 32});
  const at::Tensor d_final = torch::randn({4, 4, 32, 32});
  const Result aten = RunWithGrads(in, d_out, d_final, kAten, torch::kFloat);
  const Result cpu = RunWithGrads(in, d_out, d_final, kDispatched, torch::kFloat);
  ExpectGradsClose(cpu, aten, 1e-5);
}

// A packed row equals its documents run alone, outputs, final states and
// gradients: no state crosses a boundary. The chunks are the same either way,
// so only BLAS's choice of code path for other addresses may differ: 1e-6.
TEST_F(GatedDeltaRuleTest, PackedRowEqualsDocumentsAlone) {
  SCOPED_TRACE(SeedTrace());
  const std::vector<int64_t> lengths = {100, 1, 64, 257};
  const Inputs packed = RandomInputs(lengths, 2, 4, 16, 16, /*with_state=*/true);
  const int64_t tokens = packed.q.size(0);
  const at::Tensor d_out = torch::randn({tokens, 4, 16});
  const at::Tensor d_final = torch::randn({4, 4, 16, 16});
  const Result whole = RunWithGrads(packed, d_out, d_final, kDispatched, torch::kFloat);
  int64_t begin = 0;
  for (size_t n = 0; n < lengths.size(); ++n) {
    const int64_t length = lengths[n];
    const Inputs alone = gdr_reference::DocumentAlone(packed, n, begin, length);
    const Result one = RunWithGrads(alone, d_out.narrow(0, begin, length), d_final.narrow(0, n, 1),
                                    kDispatched, torch::kFloat);
    SCOPED_TRACE("document " + std::to_string(n));
    EXPECT_LT(RelativeError(whole.out.narrow(0, begin, length), one.out), 1e-6);
    EXPECT_LT(RelativeError(whole.final_state.narrow(0, n, 1), one.final_state), 1e-6);
    EXPECT_LT(RelativeError(whole.dq.narrow(0, begin, length), one.dq), 1e-6);
    EXPECT_LT(RelativeError(whole.dk.narrow(0, begin, length), one.dk), 1e-6);
    EXPECT_LT(RelativeError(whole.dv.narrow(0, begin, length), one.dv), 1e-6);
    EXPECT_LT(RelativeError(whole.dg.narrow(0, begin, length), one.dg), 1e-6);
    EXPECT_LT(RelativeError(whole.dbeta.narrow(0, begin, length), one.dbeta), 1e-6);
    EXPECT_LT(RelativeError(whole.dstate.narrow(0, n, 1), one.dstate), 1e-6);
    begin += length;
  }
}

// Every work item writes its own rows and every sum runs in a fixed order:
// one thread and two give the same bits.
TEST_F(GatedDeltaRuleTest, SameBitsAtAnyThreadCount) {
  SCOPED_TRACE(SeedTrace());
  const Inputs in = RandomInputs({130, 64, 7}, 2, 4, 16, 16, /*with_state=*/true);
  const at::Tensor d_out = torch::randn({in.v.size(0), 4, 16});
  const at::Tensor d_final = torch::randn({3, 4, 16, 16});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = RunWithGrads(in, d_out, d_final, kDispatched, torch::kFloat);
  at::set_num_threads(std::max(2, threads));
  const Result many = RunWithGrads(in, d_out, d_final, kDispatched, torch::kFloat);
  at::set_num_threads(threads);
  for (const auto& [got, want] :
       std::vector<std::pair<at::Tensor, at::Tensor>>{{many.out, one.out},
                                                      {many.final_state, one.final_state},
                                                      {many.dq, one.dq},
                                                      {many.dk, one.dk},
                                                      {many.dv, one.dv},
                                                      {many.dg, one.dg},
                                                      {many.dbeta, one.dbeta},
                                                      {many.dstate, one.dstate}}) {
    EXPECT_TRUE(torch::equal(got, want));
  }
}

// q, k and v as views of one fused (T, 2 Hk Dk + Hv Dv) projection, as the
// model slices in_proj_qkv's output: the kernel reads the strides and gives
// the bits of contiguous copies.
TEST_F(GatedDeltaRuleTest, ReadsStridedViewsOfAFusedProjection) {
  SCOPED_TRACE(SeedTrace());
  const int64_t tokens = 150, hk = 2, hv = 4, dk = 16, dv = 8;
  const gdr_reference::FusedQkv f = gdr_reference::FusedProjection(tokens, hk, hv, dk, dv);
  const at::Tensor &fused = f.fused, &q = f.q, &k = f.k, &v = f.v;
  ASSERT_FALSE(q.is_contiguous());
  Inputs in = RandomInputs({90, 60}, hk, hv, dk, dv, /*with_state=*/true);
  const at::Tensor d_out = torch::randn({tokens, hv, dv});
  const at::Tensor d_final = torch::randn({2, hv, dk, dv});
  in.q = q;
  in.k = k;
  in.v = v;
  const GatedDeltaRuleOutput strided =
      gated_delta_rule(q, k, v, in.g, in.beta, in.cu_seqlens, in.initial_state, in.scale);
  const GatedDeltaRuleOutput copied =
      gated_delta_rule(q.contiguous(), k.contiguous(), v.contiguous(), in.g, in.beta, in.cu_seqlens,
                       in.initial_state, in.scale);
  EXPECT_TRUE(torch::equal(strided.out, copied.out));
  EXPECT_TRUE(torch::equal(strided.final_state, copied.final_state));
  // The gradient of the fused tensor gathers the three views' gradients.
  const at::Tensor leaf = fused.clone().requires_grad_(true);
  const GatedDeltaRuleOutput o =
      gated_delta_rule(leaf.narrow(1, 0, hk * dk).view({tokens, hk, dk}),
                       leaf.narrow(1, hk * dk, hk * dk).view({tokens, hk, dk}),
                       leaf.narrow(1, 2 * hk * dk, hv * dv).view({tokens, hv, dv}), in.g, in.beta,
                       in.cu_seqlens, in.initial_state, in.scale);
  ((o.out * d_out).sum() + (o.final_state * d_final).sum()).backward();
  in.q = q.contiguous();
  in.k = k.contiguous();
  in.v = v.contiguous();
  const Result want = RunWithGrads(in, d_out, d_final, kDispatched, torch::kFloat);
  EXPECT_TRUE(torch::equal(leaf.grad().narrow(1, 0, hk * dk).view({tokens, hk, dk}), want.dq));
  EXPECT_TRUE(
      torch::equal(leaf.grad().narrow(1, hk * dk, hk * dk).view({tokens, hk, dk}), want.dk));
  EXPECT_TRUE(
      torch::equal(leaf.grad().narrow(1, 2 * hk * dk, hv * dv).view({tokens, hv, dv}), want.dv));
}

// bf16 q, k, v: computed in fp32 from the bf16 values, the output rounded to
// bf16 once (relative 2^-9 per element), the gradients of q, k, v too.
// Against float64 of the same bf16 values: 1e-2 relative, a few roundings.
TEST_F(GatedDeltaRuleTest, Bf16InputsMatchFloat64OfTheSameValues) {
  SCOPED_TRACE(SeedTrace());
  Inputs in = RandomInputs({70, 130}, 2, 4, 32, 32, /*with_state=*/true, torch::kBFloat16);
  const at::Tensor d_out = torch::randn({200, 4, 32});
  const at::Tensor d_final = torch::randn({2, 4, 32, 32});
  const Result got = RunWithGrads(in, d_out, d_final, kDispatched, torch::kBFloat16);
  EXPECT_EQ(got.out.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.dq.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(got.dg.scalar_type(), torch::kFloat);
  const Result want = RunWithGrads(in, d_out, d_final, kAten, torch::kDouble);
  ExpectGradsClose(got, want, 1e-2);
}

TEST_F(GatedDeltaRuleTest, BadArgumentsThrowNamingTheArgument) {
  const Inputs in = RandomInputs({10, 6}, 2, 4, 8, 8, /*with_state=*/true);
  auto call = [&](const Inputs& x) {
    return [x] {
      gated_delta_rule(x.q, x.k, x.v, x.g, x.beta, x.cu_seqlens, x.initial_state, x.scale);
    };
  };
  Inputs bad = in;
  bad.q = in.q.narrow(0, 0, 15);
  ExpectErrorMentions(call(bad), "k must have q's sizes");
  bad = in;
  bad.v = torch::randn({16, 3, 8});
  ExpectErrorMentions(call(bad), "Hv (3) must be a multiple");
  bad = in;
  bad.v = in.v.to(torch::kBFloat16);
  ExpectErrorMentions(call(bad), "k and v must have q's dtype");
  bad = in;
  bad.q = torch::randn({16, 8, 2}).transpose(1, 2);
  bad.k = bad.q;
  ExpectErrorMentions(call(bad), "q must have unit stride");
  bad = in;
  bad.g = torch::randn({16, 2});
  ExpectErrorMentions(call(bad), "g must be (T, Hv)");
  bad = in;
  bad.beta = torch::randn({16, 4}, torch::kDouble);
  ExpectErrorMentions(call(bad), "beta must be float32");
  bad = in;
  bad.cu_seqlens = gdr_reference::CuSeqlens({10, 5});
  ExpectErrorMentions(call(bad), "cu_seqlens must end at T = 16");
  bad = in;
  bad.cu_seqlens = torch::tensor({0, 10, 16}, torch::kInt);
  ExpectErrorMentions(call(bad), "cu_seqlens must be a 1-D int64");
  bad = in;
  bad.initial_state = torch::zeros({3, 4, 8, 8});
  ExpectErrorMentions(call(bad), "initial_state must be (N, Hv, Dk, Dv)");
  bad = in;
  bad.initial_state = in.initial_state.to(torch::kDouble);
  ExpectErrorMentions(call(bad), "initial_state must be float32");
  bad = in;
  bad.scale = std::nan("");
  ExpectErrorMentions(call(bad), "scale must be finite");
}

}  // namespace
}  // namespace ballast::kernels
