// choose_attention_kernel (kernels/attention_tiles.h): the one decision of
// which attention implementation a CUDA device runs.
#include "kernels/attention_tiles.h"

#include <algorithm>

namespace ballast::kernels {
namespace {

// The largest variant of one pass that fits `limit` bytes; rows 0 when none.
TileShape Fit(AttentionPass pass, int head_dim, const PassVariants& v, int64_t limit) {
  for (TileShape t : {v.large, v.small}) {
    if (SmemBytes(pass, head_dim, t) <= limit) return t;
  }
  return {};
}

AttentionChoice NoKernel(std::string reason, MaskKind kind, int64_t window) {
  AttentionChoice c;
  if (kind == MaskKind::kCausal && window == 0) {
    c.impl = AttentionImpl::kSdpaFallback;
    c.reason = std::move(reason);
  } else {
    c.impl = AttentionImpl::kUnsupported;
    c.reason = reason + "; the fallback (ATen SDPA with is_causal per document) cannot express " +
               (kind == MaskKind::kBlockDiffusion ? "a block-diffusion mask" : "a sliding window") +
               " without a dense mask, which attention never builds";
  }
  return c;
}

}  // namespace

AttentionChoice choose_attention_kernel(const DeviceCaps& caps, int64_t head_dim,
                                        at::ScalarType dtype, MaskKind kind, int64_t window) {
  if (caps.sm_major < 8) {
    return NoKernel("the kernel needs sm_80 or newer (cp.async, bf16 tensor cores), device is sm_" +
                        std::to_string(caps.sm_major) + std::to_string(caps.sm_minor),
                    kind, window);
  }
  if (dtype != at::kBFloat16 && dtype != at::kHalf) {
    return NoKernel(
        std::string("the kernel takes bf16 or fp16, inputs are ") + c10::toString(dtype), kind,
        window);
  }
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) {
    return NoKernel(
        "the kernel takes head dim 64, 128 or 256, inputs have " + std::to_string(head_dim), kind,
        window);
  }
  const int d = static_cast<int>(head_dim);
  const TileVariants v = TileVariantsFor(d);
  AttentionChoice c;
  c.fwd = Fit(AttentionPass::kForward, d, v.fwd, caps.smem_optin_bytes);
  c.dq = Fit(AttentionPass::kQueryGrad, d, v.dq, caps.smem_optin_bytes);
  c.dkv = Fit(AttentionPass::kKeyValueGrad, d, v.dkv, caps.smem_optin_bytes);
  if (c.fwd.rows == 0 || c.dq.rows == 0 || c.dkv.rows == 0) {
    int need = SmemBytes(AttentionPass::kForward, d, v.fwd.small);
    need = std::max(need, SmemBytes(AttentionPass::kQueryGrad, d, v.dq.small));
    need = std::max(need, SmemBytes(AttentionPass::kKeyValueGrad, d, v.dkv.small));
    return NoKernel("the kernel needs " + std::to_string(need) +
                        " bytes of shared memory per block at head dim " + std::to_string(d) +
                        ", the device allows " + std::to_string(caps.smem_optin_bytes),
                    kind, window);
  }
  c.fwd_bytes = SmemBytes(AttentionPass::kForward, d, c.fwd);
  c.dq_bytes = SmemBytes(AttentionPass::kQueryGrad, d, c.dq);
  c.dkv_bytes = SmemBytes(AttentionPass::kKeyValueGrad, d, c.dkv);
  return c;
}

}  // namespace ballast::kernels
