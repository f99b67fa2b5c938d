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

}  // namespace ballast::train
