#include "worker/train/objective/block_diffusion.h"

#include <ATen/ATen.h>

namespace ballast::train {

kernels::LossSum BlockDiffusion::Loss(const Decoder& decoder, const PackedBatch& batch,
                                      bool training) const {
  TORCH_CHECK(batch.mask.kind == kernels::MaskKind::kBlockDiffusion && batch.loss_weights.defined(),
              "a block_diffusion batch needs [x_t ; x_0] documents and their 1/p weights");
  const at::Tensor hidden = decoder.HiddenStates(batch, training);
  const at::Tensor head = decoder.lm_head_weight().to(decoder.compute_dtype());
  // counted = -1: the kernel counts the masked targets, which the loss is
  // not normalised by.
  kernels::LossSum loss = kernels::linear_cross_entropy(hidden, head, batch.targets,
                                                        batch.loss_weights, /*ignore_index=*/-100,
                                                        /*z_loss=*/0.0, /*counted=*/-1);
  loss.count = at::scalar_tensor(batch.supervised_tokens, at::TensorOptions().dtype(at::kLong));
  return loss;
}

// Which half's routing the load-balancing loss counts. SDAR's own training
// code (JetAstra/SDAR, training/model/SDAR-4B-Chat/modeling_sdar.py,
// SDARForCausalLM.prepare_for_bd_training) builds [x_t ; x_0] with a mask it
// names `router_noisy_part`, true on the noisy half, and keeps the loss's
// positions (logits_to_keep) inside it: the routing that is trained is the
// noisy half's. Its fine-tuning (LlamaFactory-SDAR, model_utils/moe.py) adds
// no aux loss of its own for SDAR. So the noisy half x_t alone counts in f
// and P and receives the aux loss's gradient; x_0 neither.
at::Tensor BlockDiffusion::BalancedTokens(const PackedBatch& batch) const {
  const at::Tensor cu = batch.cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const int64_t* bounds = cu.const_data_ptr<int64_t>();
  at::Tensor noisy = at::zeros({batch.input_ids.numel()}, at::kBool);
  for (int64_t d = 0; d + 1 < cu.numel(); ++d) {
    // Each document is [x_t ; x_0], two halves of equal length.
    noisy.narrow(0, bounds[d], (bounds[d + 1] - bounds[d]) / 2).fill_(true);
  }
  return noisy;
}

}  // namespace ballast::train
