#include "worker/train/objective/causal_lm.h"

#include <optional>

namespace ballast::train {

kernels::LossSum CausalLm::Loss(const Decoder& decoder, const PackedBatch& batch,
                                bool training) const {
  at::Tensor hidden = decoder.HiddenStates(batch, training);                     // (T, H)
  const at::Tensor head = decoder.lm_head_weight().to(decoder.compute_dtype());  // (V, H)
  std::optional<at::Tensor> weights;
  if (batch.loss_weights.defined()) weights = batch.loss_weights;
  return kernels::linear_cross_entropy(hidden, head, batch.targets, weights, /*ignore_index=*/-100,
                                       /*z_loss=*/0.0, batch.supervised_tokens);
}

}  // namespace ballast::train
