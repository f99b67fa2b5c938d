#include "worker/train/model/activation_checkpoint.h"

#include <torch/torch.h>

#include "worker/train/model/decoder.h"
#include "worker/train/model/rng_state.h"

namespace ballast::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LayerFunction : public torch::autograd::Function<LayerFunction> {
  // h (T, H); params: the layer's trainable tensors, passed so that autograd
  // routes their gradients through this node (a TensorList: autograd counts
  // its elements as inputs, where it would ignore a std::vector).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, at::TensorList params,
                            const Decoder* decoder, int64_t layer, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& cu_seqlens, int64_t mask_kind,
                            int64_t block_size) {
    ctx->saved_data["rng"] = GeneratorState(h.device());
    ctx->saved_data["mask_kind"] = mask_kind;
    ctx->saved_data["block_size"] = block_size;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["decoder"] = reinterpret_cast<int64_t>(decoder);
    ctx->saved_data["num_params"] = static_cast<int64_t>(params.size());
    variable_list saved = {h, cos, sin, cu_seqlens};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    torch::NoGradGuard no_grad;
    return decoder->LayerForward(layer, h, cos, sin,
                                 SavedAttentionMask(cu_seqlens, mask_kind, block_size),
                                 /*training=*/true);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    variable_list saved = ctx->get_saved_variables();
    const auto* decoder = reinterpret_cast<const Decoder*>(ctx->saved_data["decoder"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    const int64_t num_params = ctx->saved_data["num_params"].toInt();
    variable_list params(saved.begin() + 4, saved.end());

    // Recompute under the forward's RNG state, then give the caller's back.
    const at::Tensor rng_now = GeneratorState(saved[0].device());
    SetGeneratorState(ctx->saved_data["rng"].toTensor(), saved[0].device());
    at::Tensor h = saved[0].detach().requires_grad_(saved[0].requires_grad());
    at::Tensor out;
    {
      torch::AutoGradMode enable(true);
      const kernels::AttentionMask mask = SavedAttentionMask(
          saved[3], ctx->saved_data["mask_kind"].toInt(), ctx->saved_data["block_size"].toInt());
      out = decoder->LayerForward(layer, h, saved[1], saved[2], mask, /*training=*/true);
    }
    SetGeneratorState(rng_now, saved[0].device());

    variable_list inputs;
    if (h.requires_grad()) inputs.push_back(h);
    inputs.insert(inputs.end(), params.begin(), params.end());
    variable_list grads = torch::autograd::grad({out}, inputs, {grad_out[0]},
                                                /*retain_graph=*/false, /*create_graph=*/false,
                                                /*allow_unused=*/true);
    // One gradient per forward input: h, each param, then the non-tensor
    // arguments, cos / sin / cu_seqlens and the mask's structure, which get none.
    variable_list result;
    size_t next = 0;
    result.push_back(h.requires_grad() ? grads[next++] : at::Tensor());
    for (int64_t i = 0; i < num_params; ++i) result.push_back(grads[next++]);
    for (int i = 0; i < 7; ++i) result.push_back(at::Tensor());
    return result;
  }
};

}  // namespace

kernels::AttentionMask SavedAttentionMask(const at::Tensor& cu_seqlens, int64_t kind,
                                          int64_t block_size) {
  kernels::AttentionMask mask;
  mask.kind = static_cast<kernels::MaskKind>(kind);
  mask.block_size = block_size;
  mask.cu_seqlens = cu_seqlens;
  return mask;
}

at::Tensor CheckpointedLayer(const Decoder& decoder, const ParamStore& params, int64_t layer,
                             const at::Tensor& h, const at::Tensor& cos, const at::Tensor& sin,
                             const kernels::AttentionMask& mask) {
  variable_list trainable;
  for (const std::string& name : params.LayerNames(layer)) {
    if (params.trainable(name)) trainable.push_back(params.get(name));
  }
  return LayerFunction::apply(h, at::TensorList(trainable), &decoder, layer, cos, sin,
                              mask.cu_seqlens, static_cast<int64_t>(mask.kind), mask.block_size);
}

}  // namespace ballast::train
