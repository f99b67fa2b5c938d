#include "worker/train/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ballast::train {

double ScheduledLearningRate(const std::string& kind, double base_lr, int64_t step,
                             int64_t warmup_steps, int64_t max_steps) {
  const double s = static_cast<double>(step);
  if (step < warmup_steps) return base_lr * s / std::max<int64_t>(1, warmup_steps);
  const double decay_steps = static_cast<double>(std::max<int64_t>(1, max_steps - warmup_steps));
  if (kind == "linear") {
    return base_lr * std::max(0.0, static_cast<double>(max_steps - step) / decay_steps);
  }
  if (kind == "cosine") {
    const double progress = static_cast<double>(step - warmup_steps) / decay_steps;
    return base_lr * std::max(0.0, 0.5 * (1.0 + std::cos(M_PI * progress)));
  }
  return base_lr;
}

}  // namespace ballast::train
