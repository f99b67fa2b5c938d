// gated_delta_rule(): argument checks, the dispatch between the CPU kernel,
// the CUDA kernel and the op-by-op path, and the op-by-op path itself.
//
// The op-by-op path, per document of length L and per value head, in chunks
// of C = 64 tokens (the last one padded with g = 0, beta = 0, k = 0, which
// leave the state as it is). Within a chunk, with G_i = sum_{j <= i} g_j the
// cumulative log decay and S0 the state the chunk starts from:
//   A_ij = beta_i exp(G_i - G_j) k_i . k_j            (j < i, else 0)
//   W_v  = (I + A)^-1 (beta v),  W_k = (I + A)^-1 (beta exp(G) k)
//   U    = W_v - W_k S0                               (the delta rule's new values)
//   O    = exp(G) q S0 + P U,  P_ij = exp(G_i - G_j) q_i . k_j  (j <= i)
//   S_C  = exp(G_C) S0 + sum_j exp(G_C - G_j) k_j U_j^T
// which is transformers' torch_chunk_gated_delta_rule with the document's
// state in and out. Every exponent is <= 0 (g <= 0, j <= i), so nothing
// overflows.
#include "kernels/gated_delta_rule.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <optional>
#include <vector>

#include "kernels/cpu/gated_delta_rule_cpu.h"
#include "kernels/cu_seqlens_check.h"
#include "kernels/cuda/gated_delta_rule_cuda.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kChunk = 64;

void CheckInputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& g,
                 const at::Tensor& beta, const at::Tensor& cu_seqlens,
                 const at::Tensor& initial_state, double scale, double l2norm_eps) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(),
              "gated_delta_rule: q, k and v must be defined");
  TORCH_CHECK(q.dim() == 3, "gated_delta_rule: q must be (T, Hk, Dk), got sizes ", q.sizes());
  TORCH_CHECK(k.sizes() == q.sizes(), "gated_delta_rule: k must have q's sizes ", q.sizes(),
              ", got ", k.sizes());
  TORCH_CHECK(v.dim() == 3 && v.size(0) == q.size(0),
              "gated_delta_rule: v must be (T, Hv, Dv) with q's T = ", q.size(0), ", got sizes ",
              v.sizes());
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "gated_delta_rule: q must be float32 or bfloat16, got ", dtype);
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "gated_delta_rule: k and v must have q's dtype ", dtype, ", got ", k.scalar_type(),
              " and ", v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "gated_delta_rule: q, k and v must be on one device");
  const int64_t tokens = q.size(0), hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  TORCH_CHECK(hk >= 1 && hv >= 1 && dk >= 1 && dv >= 1,
              "gated_delta_rule: heads and head dims must be >= 1, got q ", q.sizes(), " and v ",
              v.sizes());
  TORCH_CHECK(hv % hk == 0, "gated_delta_rule: v's heads Hv (", hv,
              ") must be a multiple of q's and k's heads Hk (", hk, ")");
  TORCH_CHECK(q.stride(2) == 1, "gated_delta_rule: q must have unit stride in Dk");
  TORCH_CHECK(k.stride(2) == 1, "gated_delta_rule: k must have unit stride in Dk");
  TORCH_CHECK(v.stride(2) == 1, "gated_delta_rule: v must have unit stride in Dv");
  for (const auto& [name, t] :
       {std::pair<const char*, const at::Tensor&>{"g", g}, {"beta", beta}}) {
    TORCH_CHECK(t.defined() && t.dim() == 2 && t.size(0) == tokens && t.size(1) == hv,
                "gated_delta_rule: ", name, " must be (T, Hv) = (", tokens, ", ", hv, "), got ",
                t.defined() ? t.sizes() : at::IntArrayRef{});
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == dtype,
                "gated_delta_rule: ", name, " must be float32 or q's dtype, got ", t.scalar_type());
    TORCH_CHECK(t.device() == q.device(), "gated_delta_rule: ", name, " must be on q's device");
  }
  const int64_t docs = CheckCuSeqlens("gated_delta_rule", cu_seqlens, tokens);
  if (initial_state.defined()) {
    TORCH_CHECK(initial_state.dim() == 4 && initial_state.size(0) == docs &&
                    initial_state.size(1) == hv && initial_state.size(2) == dk &&
                    initial_state.size(3) == dv,
                "gated_delta_rule: initial_state must be (N, Hv, Dk, Dv) = (", docs, ", ", hv, ", ",
                dk, ", ", dv, "), got ", initial_state.sizes());
    TORCH_CHECK(initial_state.scalar_type() == at::kFloat,
                "gated_delta_rule: initial_state must be float32, got ",
                initial_state.scalar_type());
    TORCH_CHECK(initial_state.device() == q.device(),
                "gated_delta_rule: initial_state must be on q's device");
  }
  TORCH_CHECK(std::isfinite(scale), "gated_delta_rule: scale must be finite, got ", scale);
  TORCH_CHECK(l2norm_eps > 0 && std::isfinite(l2norm_eps),
              "gated_delta_rule: l2norm_eps must be positive, got ", l2norm_eps);
}

// One document: q, k (H, L, Dk), v (H, L, Dv), g, beta (H, L) fp32 with the
// heads already expanded; s0 (H, Dk, Dv). Returns o (H, L, Dv) and the state.
std::pair<at::Tensor, at::Tensor> ChunkedDocument(at::Tensor q, at::Tensor k, at::Tensor v,
                                                  at::Tensor g, at::Tensor beta, at::Tensor s) {
  const int64_t heads = q.size(0), length = q.size(1), dk = q.size(2), dv = v.size(2);
  const int64_t pad = (kChunk - length % kChunk) % kChunk;
  const int64_t chunks = (length + pad) / kChunk;
  q = at::constant_pad_nd(q, {0, 0, 0, pad}).view({heads, chunks, kChunk, dk});
  k = at::constant_pad_nd(k, {0, 0, 0, pad}).view({heads, chunks, kChunk, dk});
  v = at::constant_pad_nd(v, {0, 0, 0, pad}).view({heads, chunks, kChunk, dv});
  g = at::constant_pad_nd(g, {0, pad}).view({heads, chunks, kChunk});
  beta = at::constant_pad_nd(beta, {0, pad}).view({heads, chunks, kChunk});

  const at::Tensor cum = g.cumsum(-1);  // G, (H, n, C)
  const at::Tensor causal =
      at::ones({kChunk, kChunk}, q.options().dtype(at::kBool)).tril();  // j <= i
  // exp(G_i - G_j) where j <= i, else 0; the masked entries never reach exp.
  const at::Tensor decay =
      at::where(causal, cum.unsqueeze(-1) - cum.unsqueeze(-2), -INFINITY).exp();
  const at::Tensor k_beta = k * beta.unsqueeze(-1);
  // The solve reads only the strict lower triangle and takes the diagonal as 1.
  const at::Tensor a = at::matmul(k_beta, k.transpose(-1, -2)) * decay;
  const at::Tensor w_v = at::linalg_solve_triangular(a, v * beta.unsqueeze(-1), /*upper=*/false,
                                                     /*left=*/true, /*unitriangular=*/true);
  const at::Tensor w_k = at::linalg_solve_triangular(a, k_beta * cum.exp().unsqueeze(-1),
                                                     /*upper=*/false, /*left=*/true,
                                                     /*unitriangular=*/true);
  const at::Tensor p = at::matmul(q, k.transpose(-1, -2)) * decay;
  const at::Tensor q_decayed = q * cum.exp().unsqueeze(-1);
  const at::Tensor last = cum.narrow(-1, kChunk - 1, 1);  // G_C, (H, n, 1)
  const at::Tensor k_decayed = k * (last - cum).exp().unsqueeze(-1);
  const at::Tensor chunk_decay = last.exp().unsqueeze(-1);  // (H, n, 1, 1)

  std::vector<at::Tensor> outs;
  outs.reserve(chunks);
  for (int64_t i = 0; i < chunks; ++i) {
    const at::Tensor u = w_v.select(1, i) - at::matmul(w_k.select(1, i), s);
    outs.push_back(at::matmul(q_decayed.select(1, i), s) + at::matmul(p.select(1, i), u));
    s = s * chunk_decay.select(1, i) + at::matmul(k_decayed.select(1, i).transpose(-1, -2), u);
  }
  return {at::stack(outs, 1).view({heads, chunks * kChunk, dv}).narrow(1, 0, length), s};
}

// The kernel under autograd, the CPU's or the CUDA one by q's device (both
// have one contract). Keeps the inputs and the state each chunk starts from;
// the backward recomputes the rest (kernels/cpu/gated_delta_rule_cpu.cc,
// kernels/cuda/gated_delta_rule_blocks.h).
class GatedDeltaRuleKernelFunction
    : public torch::autograd::Function<GatedDeltaRuleKernelFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, const at::Tensor& g,
                                                const at::Tensor& beta,
                                                const std::optional<at::Tensor>& initial_state,
                                                const at::Tensor& cu_seqlens, double scale,
                                                double l2norm_eps) {
    const at::Tensor state = initial_state.value_or(at::Tensor());
    GdrForward fwd =
        q.is_cuda()
            ? gated_delta_rule_cuda_forward(q, k, v, g, beta, cu_seqlens, state, scale, l2norm_eps)
            : gated_delta_rule_cpu_forward(q, k, v, g, beta, cu_seqlens, state, scale, l2norm_eps);
    ctx->save_for_backward({q, k, v, g, beta, fwd.chunk_states});
    ctx->saved_data["cu_seqlens"] = cu_seqlens;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["eps"] = l2norm_eps;
    ctx->saved_data["has_state"] = initial_state.has_value();
    return {fwd.out, fwd.final_state};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor cu_seqlens = ctx->saved_data["cu_seqlens"].toTensor();
    const double scale = ctx->saved_data["scale"].toDouble();
    const double eps = ctx->saved_data["eps"].toDouble();
    GdrGrads grads = saved[0].is_cuda()
                         ? gated_delta_rule_cuda_backward(
                               saved[0], saved[1], saved[2], saved[3], saved[4], cu_seqlens,
                               saved[5], grad_outputs[0], grad_outputs[1], scale, eps)
                         : gated_delta_rule_cpu_backward(
                               saved[0], saved[1], saved[2], saved[3], saved[4], cu_seqlens,
                               saved[5], grad_outputs[0], grad_outputs[1], scale, eps);
    at::Tensor d_state = ctx->saved_data["has_state"].toBool() ? grads.d_state : at::Tensor();
    return {grads.d_q, grads.d_k,    grads.d_v,    grads.d_g,   grads.d_beta,
            d_state,   at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

GatedDeltaRuleOutput gated_delta_rule_aten(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& g,
                                           const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                           const at::Tensor& initial_state, double scale,
                                           double l2norm_eps) {
  CheckInputs(q, k, v, g, beta, cu_seqlens, initial_state, scale, l2norm_eps);
  const int64_t hk = q.size(1), dk = q.size(2), hv = v.size(1), dv = v.size(2);
  const int64_t group = hv / hk;
  // l2norm as transformers and fla: x * rsqrt(sum x^2 + eps), in fp32.
  at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat);
  qf = qf * at::rsqrt(qf.square().sum(-1, /*keepdim=*/true) + l2norm_eps) * scale;
  kf = kf * at::rsqrt(kf.square().sum(-1, /*keepdim=*/true) + l2norm_eps);
  if (group > 1) {
    qf = qf.repeat_interleave(group, 1);
    kf = kf.repeat_interleave(group, 1);
  }
  // (H, T, D) and (H, T).
  qf = qf.transpose(0, 1);
  kf = kf.transpose(0, 1);
  const at::Tensor vf = v.to(at::kFloat).transpose(0, 1);
  const at::Tensor gf = g.to(at::kFloat).t(), bf = beta.to(at::kFloat).t();
  const at::Tensor cu = cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  const int64_t docs = cu.numel() - 1;
  std::vector<at::Tensor> outs, finals;
  for (int64_t n = 0; n < docs; ++n) {
    at::Tensor s = initial_state.defined() ? initial_state.select(0, n)
                                           : at::zeros({hv, dk, dv}, qf.options());
    const int64_t begin = c[n], length = c[n + 1] - c[n];
    if (length > 0) {
      auto [o, final_state] = ChunkedDocument(
          qf.narrow(1, begin, length), kf.narrow(1, begin, length), vf.narrow(1, begin, length),
          gf.narrow(1, begin, length), bf.narrow(1, begin, length), s);
      outs.push_back(o);
      s = final_state;
    }
    finals.push_back(s);
  }
  at::Tensor out = outs.empty() ? at::zeros({hv, 0, dv}, qf.options()) : at::cat(outs, 1);
  return {out.transpose(0, 1).contiguous().to(v.scalar_type()), at::stack(finals)};
}

GatedDeltaRuleOutput gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta,
                                      const at::Tensor& cu_seqlens, const at::Tensor& initial_state,
                                      double scale, double l2norm_eps) {
  CheckInputs(q, k, v, g, beta, cu_seqlens, initial_state, scale, l2norm_eps);
  if (q.device().is_cpu() || gated_delta_rule_cuda_supports(q.size(2), q.device())) {
    torch::autograd::variable_list out = GatedDeltaRuleKernelFunction::apply(
        q, k, v, g, beta,
        initial_state.defined() ? std::optional<at::Tensor>(initial_state) : std::nullopt,
        cu_seqlens, scale, l2norm_eps);
    return {out[0], out[1]};
  }
  return gated_delta_rule_aten(q, k, v, g, beta, cu_seqlens, initial_state, scale, l2norm_eps);
}

}  // namespace ballast::kernels
