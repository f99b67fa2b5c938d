// Gated DeltaNet, the token mixer of a "linear_attention" layer (Qwen3.5;
// transformers 5.23's Qwen3_5GatedDeltaNet), with Hk key heads of Dk and Hv
// value heads of Dv (Hv a multiple of Hk), C = 2 Hk Dk + Hv Dv:
//
//   qkv, z, b, a = in_proj_qkv(x), in_proj_z(x), in_proj_b(x), in_proj_a(x)
//                                                 (T, C), (T, Hv Dv), (T, Hv), (T, Hv)
//   qkv      = silu(causal_conv1d(qkv))           depthwise, conv1d.weight (C, 1, K),
//                                                 restarting at each document
//   q, k, v  = split(qkv)                         (T, Hk, Dk), (T, Hk, Dk), (T, Hv, Dv)
//   beta     = sigmoid(b)                         fp32
//   g        = -exp(A_log) * softplus(a + dt_bias)   fp32, the log decay (<= 0)
//   o        = gated_delta_rule(q, k, v, g, beta)    kernels/gated_delta_rule.h: q, k
//                                                 L2-normalised, q scaled by Dk^-0.5,
//                                                 fp32 state per document
//   o        = norm.weight * rmsnorm(o) * silu(z)    per value head over Dv: the
//                                                 normed o rounded to the compute
//                                                 dtype, times the weight, then the
//                                                 gate in fp32, rounded once (as
//                                                 Qwen3_5RMSNormGated; not zero-centred)
//   out      = out_proj(o)                        (T, H)
//
// The projections, the conv's input and output, v and o are in the compute
// dtype; the gates, the state and the norm's statistics in fp32. A_log and
// dt_bias are read as every weight is (in the compute dtype, as a bf16 HF
// model holds them), then widened to fp32.
#ifndef BALLAST_WORKER_TRAIN_MODEL_GATED_DELTA_NET_H_
#define BALLAST_WORKER_TRAIN_MODEL_GATED_DELTA_NET_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "kernels/attention.h"

namespace ballast::train {

class Decoder;

// x (T, H), the normed input of a layer whose tensors are named `prefix` +
// "in_proj_qkv.weight" etc.; `mask` gives the documents (cu_seqlens) and must
// be causal: a recurrence has no bidirectional form (block diffusion is
// refused before a job starts; this throws c10::Error if one gets here).
// Returns out_proj's output (T, H), differentiable in x and every trainable
// tensor (A_log, dt_bias, conv1d.weight and norm.weight included).
at::Tensor GatedDeltaNet(const Decoder& decoder, const std::string& prefix, const at::Tensor& x,
                         const kernels::AttentionMask& mask, bool training);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_GATED_DELTA_NET_H_
