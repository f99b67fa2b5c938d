// BlockDiffusion: task block_diffusion (SDAR / BD3-LM SFT). The batch holds
// each document as [x_t ; x_0] under the block-diffusion mask
// (data/block_diffusion_noise.h); the loss is Σ over masked answer tokens of
// CE(own token) / p, and its count the answer tokens, never the masked
// count: an early SDAR divided by the latter and weighted tokens by 1/p².
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_BLOCK_DIFFUSION_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_BLOCK_DIFFUSION_H_

#include "worker/train/objective/objective.h"

namespace ballast::train {

class BlockDiffusion : public Objective {
 public:
  kernels::LossSum Loss(const Decoder& decoder, const PackedBatch& batch,
                        bool training) const override;
  // The noisy half x_t of each document, whose tokens the loss trains; the
  // clean half x_0 is there to be attended to (see the .cc for SDAR's code).
  at::Tensor BalancedTokens(const PackedBatch& batch) const override;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_BLOCK_DIFFUSION_H_
