// task: causal_lm. Next-token cross-entropy over the supervised targets,
// straight from the hidden states and the lm_head weight (the (T, V) logits
// are never materialised; kernels/loss.h):
//   sum   = sum_t w_t * (lse_t - logit_t[target_t])   over targets != -100
//   count = number of targets != -100
// with w_t the batch's loss_weights (1 when it has none).
#ifndef BALLAST_WORKER_TRAIN_OBJECTIVE_CAUSAL_LM_H_
#define BALLAST_WORKER_TRAIN_OBJECTIVE_CAUSAL_LM_H_

#include "worker/train/objective/objective.h"

namespace ballast::train {

class CausalLm : public Objective {
 public:
  kernels::LossSum Loss(const Decoder& decoder, const PackedBatch& batch,
                        bool training) const override;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OBJECTIVE_CAUSAL_LM_H_
