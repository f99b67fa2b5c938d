#include "worker/train/model/attention_mixer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "kernels/rope.h"
#include "worker/train/model/decoder.h"

namespace ballast::train {

at::Tensor SoftmaxAttention(const Decoder& decoder, const std::string& prefix, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin,
                            const kernels::AttentionMask& mask, bool training) {
  const ModelConfig& c = decoder.config();
  const int64_t t = x.size(0);
  const int64_t d = c.head_dim;
  const int64_t q_width = c.num_attention_heads * d;
  const int64_t kv_width = c.num_key_value_heads * d;
  const int64_t q_proj_width = c.attention_output_gate ? 2 * q_width : q_width;
  // q, k and v read the same x, so they are one projection (see Decoder::Project).
  std::vector<at::Tensor> qkv = decoder.Project(prefix, {"q_proj", "k_proj", "v_proj"}, x, training)
                                    .split_with_sizes({q_proj_width, kv_width, kv_width}, 1);
  at::Tensor q;     // (T, Hq, D)
  at::Tensor gate;  // (T, Hq, D), with the output gate only
  if (c.attention_output_gate) {
    const at::Tensor query_gate = qkv[0].view({t, c.num_attention_heads, 2 * d});
    q = query_gate.narrow(2, 0, d);
    gate = query_gate.narrow(2, d, d);
  } else {
    q = qkv[0].view({t, c.num_attention_heads, d});
  }
  at::Tensor k = qkv[1].view({t, c.num_key_value_heads, d});  // (T, Hkv, D)
  at::Tensor v = qkv[2].view({t, c.num_key_value_heads, d});  // (T, Hkv, D)
  if (c.qk_norm) {
    q = decoder.Norm(q, prefix + "q_norm.weight");
    k = decoder.Norm(k, prefix + "k_norm.weight");
  }
  q = kernels::apply_rope(q, cos, sin);  // contiguous
  k = kernels::apply_rope(k, cos, sin);
  at::Tensor attn = kernels::attention(q, k, v.contiguous(), mask, 1.0 / std::sqrt(d));
  at::Tensor out = attn.view({t, q_width});
  if (gate.defined()) out = out * at::sigmoid(gate.reshape({t, q_width}));
  return decoder.Project(prefix, {"o_proj"}, out, training);
}

}  // namespace ballast::train
