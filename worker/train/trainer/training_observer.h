// TrainingObserver: what a Trainer reports while it runs, and how it learns
// that it should stop. The Trainer calls it; it never knows where the
// reports go (a worker's socket, or nowhere for a standalone run).
//
// A report is one v1::TrainingEvent, the message the rank's worker relays
// whole to the coordinator and its watchers: a new kind of report is a new
// field of TrainingEvent and the code that produces it, and no observer
// changes.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_
#define BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_

#include <string>

#include "ballast/v1/job.pb.h"

namespace ballast::train {

// Implementations are called from the training thread only.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;

  // Every report, as the run makes it: step_metrics after every optimizer
  // step, applied or skipped; guard when the guard acts; checkpoint_saved
  // after a checkpoint folder has been renamed into place; data when
  // training starts and at each epoch after; eval after each evaluation of a
  // held-out set; log for a line of the job's event stream.
  virtual void OnEvent(const v1::TrainingEvent& event) = 0;
  // Polled between steps and never blocks; true ends the run after the
  // current step, without a checkpoint or an export.
  virtual bool StopRequested() = 0;
};

// Reports nowhere and never stops a run: a standalone run without a worker.
class NullObserver : public TrainingObserver {
 public:
  void OnEvent(const v1::TrainingEvent&) override {}
  bool StopRequested() override { return false; }
};

// A line for the job's event stream; `level` is "info", "warning" or
// "error". The channel to the worker stamps it with the rank.
inline v1::TrainingEvent LogEvent(const std::string& level, const std::string& text) {
  v1::TrainingEvent event;
  event.mutable_log()->set_level(level);
  event.mutable_log()->set_text(text);
  return event;
}

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_TRAINING_OBSERVER_H_
