#include "kernels/gated_delta_rule.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

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

class GatedDeltaRuleTest : public SeededTest {};

// The op-by-op path against the float64 recurrence: lengths around the chunk
// of 64, several documents (one empty), grouped heads, with and without an
// initial state. fp32 chunked sums against float64: 2e-5 relative leaves room
// for the triangular solve's rounding over 64 rows.
TEST_F(GatedDeltaRuleTest, AtenPathMatchesFloat64RecurrenceWithGrads) {
  SCOPED_TRACE(SeedTrace());
  for (bool with_state : {false, true}) {
    const Inputs in = RandomInputs({1, 63, 0, 64, 65, 130}, 2, 4, 16, 8, with_state);
    const at::Tensor d_out = torch::randn({in.v.size(0), 4, 8});
    const at::Tensor d_final = torch::randn({6, 4, 16, 8});
    const Result want = RunWithGrads(in, d_out, d_final, kAten, torch::kDouble);
    const Result got = RunWithGrads(in, d_out, d_final, kAten, torch::kFloat);
    SCOPED_TRACE(with_state ? "with initial state" : "zero initial state");
    ExpectGradsClose(got, want, 2e-5);
  }
}

TEST_F(GatedDeltaRuleTest, ConvAtenPathMatchesFloat64ReferenceWithGrads) {
  SCOPED_TRACE(SeedTrace());
  const at::Tensor cu = gdr_reference::CuSeqlens({1, 2, 0, 5, 17});
  for (bool with_window : {false, true}) {
    const at::Tensor x = torch::randn({25, 12}, torch::kDouble);
    const at::Tensor w = torch::randn({12, 4}, torch::kDouble);
    const at::Tensor window = with_window ? torch::randn({5, 12, 3}, torch::kDouble) : at::Tensor();
    const at::Tensor dy = torch::randn({25, 12}, torch::kDouble);
    std::vector<at::Tensor> got, want;
    for (bool reference : {false, true}) {
      at::Tensor xl = x.to(torch::kFloat).requires_grad_(true);
      at::Tensor wl = w.to(torch::kFloat).requires_grad_(true);
      at::Tensor winl = with_window ? window.to(torch::kFloat).requires_grad_(true) : at::Tensor();
      if (reference) {
        xl = x.clone().requires_grad_(true);
        wl = w.clone().requires_grad_(true);
        winl = with_window ? window.clone().requires_grad_(true) : at::Tensor();
      }
      const at::Tensor y = reference ? gdr_reference::ConvForward(xl, wl, cu, winl)
                                     : causal_conv1d_silu_aten(xl, wl, cu, winl);
      (y.to(torch::kDouble) * dy).sum().backward();
      std::vector<at::Tensor>& into = reference ? want : got;
      into = {y.detach(), xl.grad(), wl.grad()};
      if (with_window) into.push_back(winl.grad());
    }
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT(RelativeError(got[i], want[i]), 1e-6) << "output " << i;
    }
  }
}

}  // namespace
}  // namespace ballast::kernels
