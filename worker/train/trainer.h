// Trainer: one job, run to completion on one process.
//
// The step reads top to bottom: batch -> forward -> loss (sum, count) ->
// backward -> grad_norm -> guard -> clip -> optimizer -> metrics. The loss of
// every micro-batch is divided by the supervised-token count of the whole
// optimizer step (never per micro-batch, never by numel).
#ifndef BALLAST_WORKER_TRAIN_TRAINER_H_
#define BALLAST_WORKER_TRAIN_TRAINER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast::train {

class Trainer {
 public:
  // Validates the spec against the model and data (before any compute) and
  // loads everything. INVALID_ARGUMENT / NOT_FOUND name the field or file.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir);
  virtual ~Trainer() = default;

  // Trains from the newest checkpoint in out_dir/checkpoints (or from the
  // start) to max_steps, appending to out_dir/metrics.jsonl, then exports
  // out_dir/adapter (LoRA) or out_dir/model (full).
  virtual absl::Status Run() = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_H_
