// TrainingObserver: what a Trainer reports while it runs, and how it learns
// that it should stop. The Trainer calls it; it never knows where the
// reports go (a worker's socket, or nowhere for a standalone run).
#ifndef BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_
#define BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_

#include <string>

#include "ballast/v1/job.pb.h"

namespace ballast::train {

// Implementations are called from the training thread only.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;

  // After every optimizer step, applied or skipped.
  virtual void OnStep(const v1::StepMetrics& metrics) = 0;
  // When the guard acts (a skipped step).
  virtual void OnGuard(const v1::GuardEvent& event) = 0;
  // After a checkpoint folder has been renamed into place.
  virtual void OnCheckpointSaved(const v1::CheckpointSaved& saved) = 0;
  // When training starts, and at each epoch after.
  virtual void OnData(const v1::DataReport& report) = 0;
  // After each evaluation of a held-out set.
  virtual void OnEval(const v1::EvalReport& report) = 0;
  // A line for the job's event stream; level is "info", "warning" or "error".
  virtual void OnLog(const std::string& level, const std::string& text) = 0;
  // Polled between steps and never blocks; true ends the run after the
  // current step, without a checkpoint or an export.
  virtual bool StopRequested() = 0;
};

// Reports nowhere and never stops a run: a standalone run without a worker.
class NullObserver : public TrainingObserver {
 public:
  void OnStep(const v1::StepMetrics&) override {}
  void OnGuard(const v1::GuardEvent&) override {}
  void OnCheckpointSaved(const v1::CheckpointSaved&) override {}
  void OnData(const v1::DataReport&) override {}
  void OnEval(const v1::EvalReport&) override {}
  void OnLog(const std::string&, const std::string&) override {}
  bool StopRequested() override { return false; }
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_
