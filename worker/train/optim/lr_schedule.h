// The learning-rate schedules of transformers' get_scheduler.
#ifndef BALLAST_WORKER_TRAIN_OPTIM_LR_SCHEDULE_H_
#define BALLAST_WORKER_TRAIN_OPTIM_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

namespace ballast::train {

// Learning rate of optimizer step `step` (0-based) as transformers' schedules
// give it: linear warmup from 0 over warmup_steps, then constant, linear to 0,
// or cosine (half period) to 0 at max_steps.
double ScheduledLearningRate(const std::string& kind, double base_lr, int64_t step,
                             int64_t warmup_steps, int64_t max_steps);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_OPTIM_LR_SCHEDULE_H_
