// Generative reranker losses (DESIGN.md, numerics contract 3).
//
// A generative reranker (Qwen3-Reranker) scores a (query, document) candidate
// by the next-token logits of "yes" and "no" at the candidate's last real
// token. Only two rows of the lm_head matter, so the (N, V) logits are never
// formed:
//   hidden  (N, H)  hidden state at each candidate's last real token
//   yes_no  (2, H)  rows [yes_id, no_id] of the lm_head weight
//   Δ_i = h_i · w_yes − h_i · w_no = h_i · (w_yes − w_no)     fp32 (fp64 for fp64 inputs)
// The score of candidate i is
//   kLogSigmoid: s_i = log σ(Δ_i), which is log P(yes) under the two-way softmax
//                over {yes, no} that Qwen3-Reranker uses at inference (ms-swift's
//                listwise definition; the default)
//   kLogitDiff:  s_i = Δ_i
//
// Listwise. Group g holds candidates [group_offsets[g], group_offsets[g+1]): the
// positive first, then its negatives. With x_j = s_j / τ,
//   L_g = −x_0 + log Σ_j exp(x_j)      (a log-sum-exp shifted by the group max)
// Only groups with a positive and at least one negative (size >= 2) count; the
// rest add nothing and their candidates get gradient 0.
// Gradient bound: ∂L_g/∂x_j = softmax(x)_j − [j = 0] ∈ [−1, 1], and
// ∂x_j/∂Δ_j = s'(Δ_j)/τ with s' = σ(−Δ) ∈ (0, 1) for kLogSigmoid and 1 for
// kLogitDiff. Each candidate belongs to one group, so |∂sum/∂Δ_i| ≤ 1/τ for
// any Δ, ±1e4 included: the loss itself cannot make gradients explode.
//
// Pointwise. Binary cross-entropy with logits on Δ and labels y in {0, 1}:
//   L_i = max(Δ_i, 0) − Δ_i y_i + log1p(exp(−|Δ_i|)),   ∂L_i/∂Δ_i = σ(Δ_i) − y_i ∈ [−1, 1].
//
// Both return (sum, count), like linear_cross_entropy: the trainer divides by
// the global count of the optimizer step. Differentiable with respect to hidden
// and yes_no through ATen's autograd; every op used is stable at any finite Δ.
// Runs on any device ATen does; group_offsets lives on the CPU, like cu_seqlens.
#ifndef BALLAST_KERNELS_RERANKER_LOSS_H_
#define BALLAST_KERNELS_RERANKER_LOSS_H_

#include <ATen/core/Tensor.h>

#include "kernels/loss.h"

namespace ballast::kernels {

enum class RerankerScore {
  kLogSigmoid,  // s = log σ(Δ) = log P(yes)
  kLogitDiff,   // s = Δ
};

// Δ (N) = hidden @ (yes_no[0] − yes_no[1]), fp32 (fp64 for fp64 inputs). hidden
// (N, H) and yes_no (2, H) share one dtype among fp32 / bf16 / fp16 / fp64 and one
// device. Differentiable in both; pass lm_head.index_select(0, {yes_id, no_id})
// to reach the lm_head rows. Throws c10::Error naming the argument on bad input.
at::Tensor reranker_logit_diff(const at::Tensor& hidden, const at::Tensor& yes_no);

// Listwise loss over groups of logit_diff (N, fp32 or fp64). group_offsets: CPU
// int64 (G + 1), non-decreasing from 0 to N. temperature τ > 0 and finite.
// sum: Σ L_g over groups of size >= 2, in logit_diff's dtype; count: int64
// scalar, the number of those groups. With none, sum is 0 (still differentiable,
// zero gradient) and count 0. Throws c10::Error naming the argument on bad input.
LossSum listwise_reranker_loss(const at::Tensor& logit_diff, const at::Tensor& group_offsets,
                               double temperature = 1.0,
                               RerankerScore score = RerankerScore::kLogSigmoid);

// Pointwise BCE over logit_diff (N, fp32 or fp64); labels (N) bool, integer or
// floating with values in {0, 1}, on logit_diff's device. sum: Σ L_i in
// logit_diff's dtype; count: int64 scalar N. Throws c10::Error naming the
// argument on bad input.
LossSum pointwise_reranker_loss(const at::Tensor& logit_diff, const at::Tensor& labels);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_RERANKER_LOSS_H_
