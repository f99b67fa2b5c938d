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
#include "worker/train/training_observer.h"

namespace ballast::train {

struct TrainerOptions {
  // 0 resumes from the newest checkpoint. N > 0 resumes from the newest at or
  // before step N and deletes the newer ones (a rollback); with none at or
  // before N, training starts over from step 0.
  int64_t resume_at_or_before = 0;
  // Gets every report and is asked between steps whether to stop; null for a
  // standalone run. Not owned; it must outlive the Trainer.
  TrainingObserver* observer = nullptr;
};

class Trainer {
 public:
  // Validates the spec against the model and data (before any compute) and
  // loads everything. INVALID_ARGUMENT / NOT_FOUND name the field or file.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const v1::JobSpec& spec,
                                                         const std::string& out_dir,
                                                         TrainerOptions options = {});
  virtual ~Trainer() = default;

  // Trains from the checkpoint TrainerOptions picks (or from the start) to
  // max_steps, appending to out_dir/metrics.jsonl, then exports
  // out_dir/adapter (LoRA) or out_dir/model (full). CANCELLED when the
  // observer asked to stop: the step in progress finished and nothing more
  // was written.
  virtual absl::Status Run() = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_H_
