// Softmax attention, the token mixer of a "full_attention" layer:
//
//   q, k, v = q_proj(x), k_proj(x), v_proj(x)         (T, Hq | Hkv | Hkv, D)
//   q, k    = q_norm(q), k_norm(k)                     per head, when qk_norm
//   q, k    = rope(q), rope(k)                         first rotary_dim channels
//   o       = attention(q, k, v), scale D^-0.5         GQA, the batch's mask
//   out     = o_proj(o)                                (T, H)
//
// With the output gate (Qwen3.5), q_proj gives 2D channels per head,
// [query (D) | gate (D)] head by head, and o * sigmoid(gate) goes into o_proj
// (transformers 5.23's Qwen3_5Attention). Every step is in the compute
// dtype; the kernels accumulate in fp32.
#ifndef BALLAST_WORKER_TRAIN_MODEL_ATTENTION_MIXER_H_
#define BALLAST_WORKER_TRAIN_MODEL_ATTENTION_MIXER_H_

#include <ATen/core/Tensor.h>

#include <string>

#include "kernels/attention.h"

namespace ballast::train {

class Decoder;

// x (T, H), the normed input of a layer whose attention tensors are named
// `prefix` + "q_proj.weight" etc.; cos and sin (T, rotary_dim). Returns
// o_proj's output (T, H), differentiable in x and every trainable tensor.
at::Tensor SoftmaxAttention(const Decoder& decoder, const std::string& prefix, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const kernels::AttentionMask& mask, bool training);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_ATTENTION_MIXER_H_
