// AdamW with the semantics of torch.optim.AdamW (single-tensor path,
// amsgrad=False), over the trainable tensors of a ParamStore, with fp32 state.
// Per tensor p with gradient g at step s (1-based):
//   p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^s) * m / (sqrt(v) / sqrt(1 - beta2^s) + eps)
#ifndef BALLAST_WORKER_TRAIN_OPTIMIZER_H_
#define BALLAST_WORKER_TRAIN_OPTIMIZER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/train/param_store.h"

namespace ballast::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

class AdamW {
 public:
  AdamW(AdamWConfig config, const ParamStore& params);

  // Applies one update with learning rate `lr` from each tensor's .grad().
  // A trainable tensor without a gradient is left as is (as torch does).
  void step(const ParamStore& params, double lr);

  // Steps taken so far (the bias-correction counter).
  int64_t steps() const { return steps_; }

  // State for checkpoints: "<name>.exp_avg", "<name>.exp_avg_sq", and
  // "__step__" (int64 scalar).
  std::map<std::string, at::Tensor> state_dict() const;
  // Restores a state_dict(); DATA_LOSS names the missing or misshapen entry.
  absl::Status load_state_dict(const std::map<std::string, at::Tensor>& state);

 private:
  struct Moments {
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
  };
  AdamWConfig config_;
  std::map<std::string, Moments> moments_;
  int64_t steps_ = 0;
};

// Learning rate of optimizer step `step` (0-based) as transformers' schedules
// give it: linear warmup from 0 over warmup_steps, then constant, linear to 0,
// or cosine (half period) to 0 at max_steps.
double ScheduledLearningRate(const std::string& kind, double base_lr, int64_t step,
                             int64_t warmup_steps, int64_t max_steps);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OPTIMIZER_H_
