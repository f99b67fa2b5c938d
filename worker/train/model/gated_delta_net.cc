#include "worker/train/model/gated_delta_net.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/gated_delta_rule.h"
#include "kernels/rms_norm.h"
#include "worker/train/model/decoder.h"

namespace ballast::train {

at::Tensor GatedDeltaNet(const Decoder& decoder, const std::string& prefix, const at::Tensor& x,
                         const kernels::AttentionMask& mask, bool training) {
  TORCH_CHECK(mask.kind == kernels::MaskKind::kCausal, "GatedDeltaNet (", prefix,
              "): only a causal mask has a meaning for a recurrence");
  const ModelConfig& c = decoder.config();
  const GatedDeltaNetConfig& g = c.linear_attention;
  const int64_t t = x.size(0);
  // The four input projections read the same x: one GEMM (see Decoder::Project).
  const std::vector<at::Tensor> proj =
      decoder.Project(prefix, {"in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"}, x, training)
          .split_with_sizes({g.conv_dim(), g.value_dim(), g.num_value_heads, g.num_value_heads}, 1);

  const at::Tensor conv_weight =
      decoder.Weight(prefix + "conv1d.weight").view({g.conv_dim(), g.conv_kernel});  // (C, K)
  const at::Tensor qkv =
      kernels::causal_conv1d_silu(proj[0], conv_weight, mask.cu_seqlens, at::Tensor());  // (T, C)
  const at::Tensor q = qkv.narrow(1, 0, g.key_dim()).view({t, g.num_key_heads, g.key_head_dim});
  const at::Tensor k =
      qkv.narrow(1, g.key_dim(), g.key_dim()).view({t, g.num_key_heads, g.key_head_dim});
  const at::Tensor v =
      qkv.narrow(1, 2 * g.key_dim(), g.value_dim()).view({t, g.num_value_heads, g.value_head_dim});

  // The gates, (T, Hv) fp32. transformers takes sigmoid in the compute dtype.
  const at::Tensor beta = at::sigmoid(proj[2]).to(at::kFloat);
  const at::Tensor a_log = decoder.Weight(prefix + "A_log").to(at::kFloat);
  const at::Tensor dt_bias = decoder.Weight(prefix + "dt_bias").to(at::kFloat);
  const at::Tensor decay = -at::exp(a_log) * at::softplus(proj[3].to(at::kFloat) + dt_bias);

  const kernels::GatedDeltaRuleOutput rule = kernels::gated_delta_rule(
      q, k, v, decay, beta, mask.cu_seqlens, at::Tensor(),
      1.0 / std::sqrt(static_cast<double>(g.key_head_dim)));  // (T, Hv, Dv)

  // The gated RMSNorm per value head.
  const at::Tensor z = proj[1].view({t, g.num_value_heads, g.value_head_dim});
  const at::Tensor normed =
      kernels::rms_norm(rule.out, decoder.Weight(prefix + "norm.weight"), c.rms_norm_eps);
  const at::Tensor gated =
      (normed.to(at::kFloat) * at::silu(z.to(at::kFloat))).to(rule.out.scalar_type());
  return decoder.Project(prefix, {"out_proj"}, gated.view({t, g.value_dim()}), training);
}

}  // namespace ballast::train
