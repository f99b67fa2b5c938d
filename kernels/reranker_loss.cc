// Generative reranker losses (math and guarantees in kernels/reranker_loss.h).
//
// Inputs are small (one row per candidate), so these are plain ATen ops under
// autograd on whatever device the inputs live on; what makes them safe is the
// choice of ops:
//   - Δ is formed as h · (w_yes − w_no) after upcasting to fp32: the weight
//     difference of two bf16 / fp16 entries is exact in fp32 unless their
//     magnitudes differ by more than 2^13, and there is no cancellation
//     between two large logits.
//   - log σ uses at::log_sigmoid, whose forward is min(Δ, 0) − log1p(exp(−|Δ|))
//     and whose backward is σ(−Δ) computed from exp(−|Δ|): finite at ±1e4 and
//     exact at Δ = 0, where autograd through min and abs would take a
//     one-sided subgradient.
//   - The per-group log-sum-exp subtracts the group max, so every exp has an
//     argument <= 0 and the sum is in [1, group size]; the max is detached
//     because the log-sum-exp does not depend on the shift.
//   - The pointwise loss is at::binary_cross_entropy_with_logits, whose forward
//     is the stable form in the header and whose backward is σ(Δ) − y.
// The groups that count are found on the host from group_offsets, and only
// their candidates are gathered, so skipped candidates get exactly zero
// gradient and a run with no such group still yields a differentiable 0.
#include "kernels/reranker_loss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

namespace ballast::kernels {
namespace {

void check_logit_diff(const char* fn, const at::Tensor& logit_diff) {
  TORCH_CHECK(logit_diff.defined(), fn, ": logit_diff must be defined");
  TORCH_CHECK(logit_diff.dim() == 1, fn, ": logit_diff must be 1-D (N), got sizes ",
              logit_diff.sizes());
  TORCH_CHECK(logit_diff.scalar_type() == at::kFloat || logit_diff.scalar_type() == at::kDouble, fn,
              ": logit_diff must be fp32 or fp64 (reranker_logit_diff gives fp32), got ",
              logit_diff.scalar_type());
}

// The candidates of the groups of size >= 2, gathered from the host offsets.
struct CountedGroups {
  at::Tensor members;  // (N_c) int64: candidate indices, group by group
  at::Tensor segment;  // (N_c) int64: the counted group of each member, in [0, G_c)
  at::Tensor first;    // (G_c) int64: position in members of each group's positive
  int64_t count = 0;   // G_c
};

CountedGroups counted_groups(const at::Tensor& group_offsets, int64_t num_candidates,
                             const at::Device& device) {
  TORCH_CHECK(group_offsets.defined(), "listwise_reranker_loss: group_offsets must be defined");
  TORCH_CHECK(group_offsets.dim() == 1 && group_offsets.numel() >= 1 &&
                  group_offsets.scalar_type() == at::kLong && group_offsets.device().is_cpu(),
              "listwise_reranker_loss: group_offsets must be a non-empty 1-D int64 CPU tensor, "
              "got ",
              group_offsets.scalar_type(), " ", group_offsets.sizes(), " on ",
              group_offsets.device());
  const at::Tensor offsets = group_offsets.contiguous();
  const int64_t* o = offsets.const_data_ptr<int64_t>();
  const int64_t num_groups = offsets.numel() - 1;
  TORCH_CHECK(o[0] == 0, "listwise_reranker_loss: group_offsets must start at 0, got ", o[0]);
  TORCH_CHECK(o[num_groups] == num_candidates,
              "listwise_reranker_loss: group_offsets must end at N = ", num_candidates, ", got ",
              o[num_groups]);
  std::vector<int64_t> members, segment, first;
  for (int64_t g = 0; g < num_groups; ++g) {
    TORCH_CHECK(o[g + 1] >= o[g],
                "listwise_reranker_loss: group_offsets must be non-decreasing, got [", g + 1,
                "] = ", o[g + 1], " < [", g, "] = ", o[g]);
    if (o[g + 1] - o[g] < 2) continue;
    const int64_t counted = static_cast<int64_t>(first.size());
    first.push_back(static_cast<int64_t>(members.size()));
    for (int64_t i = o[g]; i < o[g + 1]; ++i) {
      members.push_back(i);
      segment.push_back(counted);
    }
  }
  const at::TensorOptions opts = at::TensorOptions().dtype(at::kLong);
  return {at::tensor(members, opts).to(device), at::tensor(segment, opts).to(device),
          at::tensor(first, opts).to(device), static_cast<int64_t>(first.size())};
}

}  // namespace

at::Tensor reranker_logit_diff(const at::Tensor& hidden, const at::Tensor& yes_no) {
  TORCH_CHECK(hidden.defined() && yes_no.defined(),
              "reranker_logit_diff: hidden and yes_no must be defined");
  TORCH_CHECK(hidden.dim() == 2, "reranker_logit_diff: hidden must be 2-D (N, H), got sizes ",
              hidden.sizes());
  TORCH_CHECK(yes_no.dim() == 2 && yes_no.size(0) == 2 && yes_no.size(1) == hidden.size(1),
              "reranker_logit_diff: yes_no must be (2, H = ", hidden.size(1),
              ") holding the yes and no rows of the lm_head, got sizes ", yes_no.sizes());
  const at::ScalarType dtype = hidden.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble,
      "reranker_logit_diff: hidden must be fp32, bf16, fp16 or fp64, got ", dtype);
  TORCH_CHECK(yes_no.scalar_type() == dtype,
              "reranker_logit_diff: yes_no must have hidden's dtype ", dtype, ", got ",
              yes_no.scalar_type());
  TORCH_CHECK(yes_no.device() == hidden.device(), "reranker_logit_diff: yes_no is on ",
              yes_no.device(), " but hidden is on ", hidden.device());
  // fp64 stays fp64 so that finite differences in fp64 can check the gradients.
  const at::ScalarType acc = dtype == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor w = yes_no.to(acc);         // (2, H)
  return at::mv(hidden.to(acc), w[0] - w[1]);  // (N)
}

LossSum listwise_reranker_loss(const at::Tensor& logit_diff, const at::Tensor& group_offsets,
                               double temperature, RerankerScore score) {
  check_logit_diff("listwise_reranker_loss", logit_diff);
  TORCH_CHECK(std::isfinite(temperature) && temperature > 0,
              "listwise_reranker_loss: temperature must be > 0 and finite, got ", temperature);
  TORCH_CHECK(score == RerankerScore::kLogSigmoid || score == RerankerScore::kLogitDiff,
              "listwise_reranker_loss: unknown score ", static_cast<int>(score));
  const CountedGroups groups =
      counted_groups(group_offsets, logit_diff.size(0), logit_diff.device());

  const at::Tensor delta = logit_diff.index_select(0, groups.members);  // (N_c)
  const at::Tensor s = score == RerankerScore::kLogSigmoid ? at::log_sigmoid(delta) : delta;
  const at::Tensor x = s / temperature;  // (N_c)
  const at::Tensor shift =
      at::full({groups.count}, -std::numeric_limits<double>::infinity(), x.options())
          .scatter_reduce_(0, groups.segment, x.detach(), "amax");         // (G_c)
  const at::Tensor e = (x - shift.index_select(0, groups.segment)).exp();  // (N_c) in (0, 1]
  const at::Tensor sum_exp = at::zeros({groups.count}, x.options()).index_add(0, groups.segment, e);
  const at::Tensor lse = shift + sum_exp.log();  // (G_c)
  const at::Tensor sum = (lse - x.index_select(0, groups.first)).sum();
  return {sum, at::scalar_tensor(groups.count, logit_diff.options().dtype(at::kLong))};
}

LossSum pointwise_reranker_loss(const at::Tensor& logit_diff, const at::Tensor& labels) {
  check_logit_diff("pointwise_reranker_loss", logit_diff);
  const int64_t n = logit_diff.size(0);
  TORCH_CHECK(labels.defined() && labels.dim() == 1 && labels.size(0) == n,
              "pointwise_reranker_loss: labels must be 1-D of length N = ", n, ", got sizes ",
              labels.defined() ? labels.sizes() : at::IntArrayRef{});
  TORCH_CHECK(!labels.is_complex(), "pointwise_reranker_loss: labels must be real, got ",
              labels.scalar_type());
  TORCH_CHECK(labels.device() == logit_diff.device(), "pointwise_reranker_loss: labels is on ",
              labels.device(), " but logit_diff is on ", logit_diff.device());
  const at::Tensor y = labels.to(logit_diff.scalar_type());  // (N)
  // One reduction and, only on failure, a second to name the first bad position.
  const at::Tensor bad = y.ne(0).logical_and_(y.ne(1));  // (N)
  if (bad.any().item<bool>()) {
    const int64_t pos = bad.to(at::kByte).argmax().item<int64_t>();
    TORCH_CHECK(false, "pointwise_reranker_loss: labels[", pos, "] = ", y[pos].item<double>(),
                " is not 0 or 1");
  }
  const at::Tensor sum =
      at::binary_cross_entropy_with_logits(logit_diff, y, {}, {}, at::Reduction::Sum);
  return {sum, at::scalar_tensor(n, logit_diff.options().dtype(at::kLong))};
}

}  // namespace ballast::kernels
