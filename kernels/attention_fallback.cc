// attention_sdpa (kernels/attention_fallback.h).
//
// For document d over tokens [b, e) and every query head h (kv head
// h / (Hq / Hkv)):
//   out[b:e, h] = SDPA(q[b:e, h], k[b:e, g], v[b:e, g], is_causal, scale)
// in (heads, L, D) layout, the transposed view of (L, heads, D). Empty
// documents produce nothing; the outputs are concatenated back along tokens.
#include "kernels/attention_fallback.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <vector>

namespace ballast::kernels {

at::Tensor attention_sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionMask& mask, double scale) {
  TORCH_CHECK(mask.kind == MaskKind::kCausal && mask.window == 0,
              "attention: the SDPA fallback runs causal masks only; a ",
              mask.kind == MaskKind::kBlockDiffusion ? "block-diffusion mask"
                                                     : "sliding window (mask.window > 0)",
              " would need a dense mask, which attention never builds");
  const at::Tensor cu = mask.cu_seqlens.contiguous();
  const int64_t* c = cu.const_data_ptr<int64_t>();
  std::vector<at::Tensor> outs;
  for (int64_t d = 0; d + 1 < cu.numel(); ++d) {
    const int64_t len = c[d + 1] - c[d];
    if (len == 0) continue;
    // (heads, L, D) views of the document's rows.
    const at::Tensor qd = q.narrow(0, c[d], len).transpose(0, 1);
    const at::Tensor kd = k.narrow(0, c[d], len).transpose(0, 1);
    const at::Tensor vd = v.narrow(0, c[d], len).transpose(0, 1);
    const at::Tensor od = at::scaled_dot_product_attention(
        qd, kd, vd, /*attn_mask=*/std::nullopt, /*dropout_p=*/0.0, /*is_causal=*/true, scale,
        /*enable_gqa=*/q.size(1) != k.size(1));
    outs.push_back(od.transpose(0, 1));  // (L, Hq, D)
  }
  if (outs.empty()) return at::empty_like(q);
  return outs.size() == 1 ? outs[0].contiguous() : at::cat(outs, 0);
}

void log_attention_fallback_once(const std::string& reason) {
  static std::mutex mu;
  static auto* logged = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (!logged->insert(reason).second) return;
  std::fprintf(stderr, "attention: %s; using ATen SDPA per document (is_causal)\n", reason.c_str());
}

}  // namespace ballast::kernels
