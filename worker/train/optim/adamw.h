// AdamW with the semantics of torch.optim.AdamW (single-tensor path,
// amsgrad=False), over the trainable tensors of a ParamStore, with fp32 state.
// Per tensor p with gradient g at step s (1-based):
//   p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^s) * m / (sqrt(v) / sqrt(1 - beta2^s) + eps)
#ifndef BALLAST_WORKER_TRAIN_OPTIM_ADAMW_H_
#define BALLAST_WORKER_TRAIN_OPTIM_ADAMW_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Thread-compatible.
class AdamW {
 public:
  AdamW(AdamWConfig config, const ParamStore& params);

  // Applies one update with learning rate `lr` from each tensor's .grad().
  // A trainable tensor without a gradient is left as is (as torch does).
  void Step(const ParamStore& params, double lr);

  // Steps taken so far (the bias-correction counter).
  int64_t steps() const { return steps_; }

  // State for checkpoints: "<name>.exp_avg", "<name>.exp_avg_sq", and
  // "__step__" (int64 scalar).
  std::map<std::string, at::Tensor> StateDict() const;
  // Restores a StateDict(); DATA_LOSS names the missing or misshapen entry.
  absl::Status LoadStateDict(const std::map<std::string, at::Tensor>& state);

 private:
  struct Moments {
    at::Tensor exp_avg;
    at::Tensor exp_avg_sq;
  };
  AdamWConfig config_;
  std::map<std::string, Moments> moments_;
  int64_t steps_ = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OPTIM_ADAMW_H_
