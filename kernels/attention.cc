// attention(): argument checks, the autograd wrapper, and the one dispatch
// point over the CPU kernel, the CUDA kernel and the SDPA fallback. Both
// kernels read the mask compiled by interval_mask(), held in the batch's
// MaskPlan (built once, shared by every layer), so they mask identically.
//
// The forward keeps q, k, v, out, the (Hq, T) log-sum-exp and the plan for
// the backward, which recomputes the probabilities tile by tile instead of
// storing them. The fallback is differentiated by ATen's autograd.
#include "kernels/attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention_fallback.h"
#include "kernels/attention_plan.h"
#include "kernels/attention_tiles.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cuda/attention_cuda.h"

namespace ballast::kernels {
namespace {

constexpr int64_t kMaxHeadDim = 256;

void CheckInputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const AttentionMask& mask, double scale) {
  TORCH_CHECK(q.defined() && k.defined() && v.defined(), "attention: q, k and v must be defined");
  TORCH_CHECK(q.dim() == 3, "attention: q must be (T, Hq, D), got sizes ", q.sizes());
  TORCH_CHECK(k.dim() == 3, "attention: k must be (T, Hkv, D), got sizes ", k.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), "attention: v must have k's sizes ", k.sizes(), ", got ",
              v.sizes());
  const at::ScalarType dtype = q.scalar_type();
  TORCH_CHECK(
      dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf || dtype == at::kDouble,
      "attention: q must be fp32, bf16, fp16 or fp64, got ", dtype);
  TORCH_CHECK(k.scalar_type() == dtype && v.scalar_type() == dtype,
              "attention: k and v must have q's dtype ", dtype, ", got ", k.scalar_type(), " and ",
              v.scalar_type());
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(),
              "attention: q, k and v must be on one device, got ", q.device(), ", ", k.device(),
              ", ", v.device());
  TORCH_CHECK(q.is_contiguous(), "attention: q must be contiguous");
  TORCH_CHECK(k.is_contiguous(), "attention: k must be contiguous");
  TORCH_CHECK(v.is_contiguous(), "attention: v must be contiguous");

  const int64_t num_tokens = q.size(0);
  const int64_t num_heads = q.size(1);
  const int64_t num_kv_heads = k.size(1);
  const int64_t head_dim = q.size(2);
  TORCH_CHECK(k.size(0) == num_tokens, "attention: k must have q's T = ", num_tokens,
              " tokens, got ", k.size(0));
  TORCH_CHECK(k.size(2) == head_dim, "attention: k must have q's head dim D = ", head_dim, ", got ",
              k.size(2));
  TORCH_CHECK(head_dim >= 1 && head_dim <= kMaxHeadDim, "attention: head dim D must be in [1, ",
              kMaxHeadDim, "], got ", head_dim);
  TORCH_CHECK(num_kv_heads >= 1 && num_heads >= 1,
              "attention: Hq and Hkv must be >= 1, got Hq = ", num_heads, ", Hkv = ", num_kv_heads);
  TORCH_CHECK(num_heads % num_kv_heads == 0, "attention: Hq (", num_heads,
              ") must be a multiple of Hkv (", num_kv_heads, ")");
  // The CPU kernel hands row strides to BLAS, whose integers are 32-bit.
  TORCH_CHECK(num_heads * head_dim <= std::numeric_limits<int32_t>::max(),
              "attention: Hq * D must be below 2^31, got ", num_heads * head_dim);
  TORCH_CHECK(std::isfinite(scale), "attention: scale must be finite, got ", scale);

  const at::Tensor& cu = mask.cu_seqlens;
  TORCH_CHECK(cu.defined(), "attention: mask.cu_seqlens must be defined");
  TORCH_CHECK(
      cu.dim() == 1 && cu.numel() >= 1 && cu.scalar_type() == at::kLong && cu.device().is_cpu(),
      "attention: mask.cu_seqlens must be a non-empty 1-D int64 CPU tensor, got ", cu.scalar_type(),
      " ", cu.sizes(), " on ", cu.device());
  const at::Tensor cuc = cu.contiguous();
  const int64_t* c = cuc.const_data_ptr<int64_t>();
  const int64_t num_docs = cu.numel() - 1;
  TORCH_CHECK(c[0] == 0, "attention: mask.cu_seqlens must start at 0, got ", c[0]);
  TORCH_CHECK(c[num_docs] == num_tokens, "attention: mask.cu_seqlens must end at T = ", num_tokens,
              ", got ", c[num_docs]);
  for (int64_t d = 0; d < num_docs; ++d) {
    TORCH_CHECK(c[d + 1] >= c[d], "attention: mask.cu_seqlens must be non-decreasing, got [", d + 1,
                "] = ", c[d + 1], " < [", d, "] = ", c[d]);
  }

  switch (mask.kind) {
    case MaskKind::kCausal:
      TORCH_CHECK(mask.window >= 0, "attention: mask.window must be >= 0, got ", mask.window);
      TORCH_CHECK(mask.block_size == 0,
                  "attention: mask.block_size applies to kBlockDiffusion only, got ",
                  mask.block_size);
      break;
    case MaskKind::kBlockDiffusion:
      TORCH_CHECK(mask.block_size >= 1, "attention: mask.block_size must be >= 1, got ",
                  mask.block_size);
      TORCH_CHECK(mask.window == 0, "attention: mask.window applies to kCausal only, got ",
                  mask.window);
      for (int64_t d = 0; d < num_docs; ++d) {
        TORCH_CHECK((c[d + 1] - c[d]) % 2 == 0, "attention: with kBlockDiffusion, document ", d,
                    " must hold a noisy and a clean half of equal length, got odd length ",
                    c[d + 1] - c[d]);
      }
      break;
    default:
      TORCH_CHECK(false, "attention: unknown mask.kind ", static_cast<int>(mask.kind));
  }
}

// The key intervals and tile lists of the batch's mask, and the tiles the
// CUDA kernel runs with (unused on CPU), for the forward and the backward.
struct Plan {
  c10::intrusive_ptr<MaskPlan> mask;
  AttentionChoice tiles;
};

AttentionCpuForward Forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const Plan& plan, double scale) {
  if (q.is_cuda()) {
    AttentionCudaForward result =
        attention_cuda_forward(q, k, v, *plan.mask, plan.tiles.fwd, scale);
    return {result.out, result.lse};
  }
  return attention_cpu_forward(q, k, v, plan.mask->intervals(), scale);
}

AttentionCpuGrads Backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                           const Plan& plan, double scale) {
  if (q.is_cuda()) {
    AttentionCudaGrads grads = attention_cuda_backward(grad_out, q, k, v, out, lse, *plan.mask,
                                                       plan.tiles.dq, plan.tiles.dkv, scale);
    return {grads.q, grads.k, grads.v};
  }
  return attention_cpu_backward(grad_out, q, k, v, out, lse, plan.mask->intervals(), scale);
}

// Keeps the plan itself for the backward (as a capsule), so the backward
// never recompiles the mask or copies it again.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, const Plan& plan,
                            double scale) {
    AttentionCpuForward result = Forward(q, k, v, plan, scale);
    ctx->save_for_backward({q, k, v, result.out, result.lse});
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan.mask);
    ctx->saved_data["tiles"] = std::vector<int64_t>{plan.tiles.dq.rows, plan.tiles.dq.cols,
                                                    plan.tiles.dkv.rows, plan.tiles.dkv.cols};
    ctx->saved_data["scale"] = scale;
    return result.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    Plan plan;
    plan.mask = c10::static_intrusive_pointer_cast<MaskPlan>(ctx->saved_data["plan"].toCapsule());
    const std::vector<int64_t> t = ctx->saved_data["tiles"].toIntVector();
    plan.tiles.dq = {static_cast<int>(t[0]), static_cast<int>(t[1])};
    plan.tiles.dkv = {static_cast<int>(t[2]), static_cast<int>(t[3])};
    AttentionCpuGrads grads = Backward(grad_outputs[0], saved[0], saved[1], saved[2], saved[3],
                                       saved[4], plan, ctx->saved_data["scale"].toDouble());
    // One entry per forward argument; the plan and the scale get none.
    return {grads.q, grads.k, grads.v, at::Tensor(), at::Tensor()};
  }
};

// BALLAST_ATTENTION_FALLBACK=1 sends every call to the SDPA fallback, on CPU
// too: for checks that compare it with the kernels.
bool FallbackForced() {
  const char* env = std::getenv("BALLAST_ATTENTION_FALLBACK");
  return env != nullptr && std::string(env) == "1";
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionMask& mask, double scale) {
  CheckInputs(q, k, v, mask, scale);
  TORCH_CHECK(q.device().is_cpu() || q.is_cuda(), "attention: q must be on CPU or CUDA, got ",
              q.device());
  if (FallbackForced()) {
    log_attention_fallback_once("BALLAST_ATTENTION_FALLBACK=1 is set");
    return attention_sdpa(q, k, v, mask, scale);
  }
  AttentionChoice choice;
  if (q.is_cuda()) {
    choice = choose_attention_kernel(attention_device_caps(q.device()), q.size(2), q.scalar_type(),
                                     mask.kind, mask.window);
  }
  if (choice.impl == AttentionImpl::kKernel) {
    return AttentionFunction::apply(q, k, v, Plan{mask_plan(mask, q.size(0)), choice}, scale);
  }
  TORCH_CHECK(choice.impl == AttentionImpl::kSdpaFallback, "attention: no implementation for ",
              "these inputs on ", q.device(), ": ", choice.reason);
  log_attention_fallback_once(choice.reason);
  return attention_sdpa(q, k, v, mask, scale);
}

}  // namespace ballast::kernels
