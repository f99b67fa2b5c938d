// gated_delta_rule: the token mixer of Gated DeltaNet (Qwen3.5's linear
// attention layers) on packed variable-length batches.
//
// Per value head, with state S in R^{Dk x Dv} (fp32), for t in a document:
//   S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T
//   o_t = S_t^T q_t
// q and k are first L2-normalised per head in fp32 (x / sqrt(sum x^2 + eps),
// as transformers' l2norm and fla's use_qk_l2norm_in_kernel), and q is
// multiplied by `scale` (Dk^-0.5 in Qwen3.5).
//
// Layout, documents packed along one token axis:
//   q, k          (T, Hk, Dk)   fp32 or bf16, unit stride in Dk (views of a
//                               fused projection are fine)
//   v             (T, Hv, Dv)   same dtype; Hv % Hk == 0: value head h reads
//                               key head h / (Hv / Hk) (transformers'
//                               repeat_interleave, without the copy)
//   g, beta       (T, Hv)       fp32 (or q's dtype, read as fp32): g <= 0 is
//                               the log decay, beta the write strength
//                               (sigmoid of in_proj_b); gradients in their dtypes
//   cu_seqlens    int64 (N + 1) on CPU, ascending, [0] == 0, back() == T
//   initial_state (N, Hv, Dk, Dv) fp32, or undefined for zeros
//   out           (T, Hv, Dv)   v's dtype
//   final_state   (N, Hv, Dk, Dv) fp32: the state after each document's last
//                 token, so that a caller can carry it on (context
//                 parallelism, incremental decoding)
// The state restarts at every document boundary: a packed row equals its
// documents run one by one (transformers' torch fallback ignores cu_seqlens,
// transformers #46851; 5.23 refuses cu_seqlens there unless fla is installed). Computed in chunks
// of 64 tokens in the WY form, all in fp32; memory O(T (Dk + Dv) Hv + chunks Hv Dk Dv), never
// O(T^2).
//
// Differentiable in q, k, v, g, beta and initial_state, and through both
// outputs: a gradient of final_state flows back into the document's tokens
// and its initial_state, as context parallelism needs. Throws c10::Error
// naming the argument when shapes, dtypes or cu_seqlens are inconsistent.
//
// Implementations: on CPU the hand-written kernel (kernels/cpu/
// gated_delta_rule_cpu.h); on CUDA the kernel of kernels/cuda/
// gated_delta_rule_cuda.h where the build has it and the device gives it the
// shared memory Dk needs (Dk <= 128 on sm_80, <= 256 on sm_90); on any other
// device, or where that does not hold, the op-by-op path below.
#ifndef BALLAST_KERNELS_GATED_DELTA_RULE_H_
#define BALLAST_KERNELS_GATED_DELTA_RULE_H_

#include <ATen/core/Tensor.h>

namespace ballast::kernels {

struct GatedDeltaRuleOutput {
  at::Tensor out;
  at::Tensor final_state;
};

GatedDeltaRuleOutput gated_delta_rule(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& g, const at::Tensor& beta,
                                      const at::Tensor& cu_seqlens, const at::Tensor& initial_state,
                                      double scale, double l2norm_eps = 1e-6);

// The same computation in ATen ops, one document at a time, each in chunks of
// 64 with the WY factors from a unit-triangular solve; autograd derives its
// backward. gated_delta_rule() runs it on devices without a kernel of their
// own; it is public so that the tests can hold the kernel against it.
GatedDeltaRuleOutput gated_delta_rule_aten(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& g,
                                           const at::Tensor& beta, const at::Tensor& cu_seqlens,
                                           const at::Tensor& initial_state, double scale,
                                           double l2norm_eps = 1e-6);

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_GATED_DELTA_RULE_H_
