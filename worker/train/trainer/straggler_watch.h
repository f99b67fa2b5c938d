// StragglerWatch: finds the rank that holds a gang's steps back (the
// progress watchdog's straggler, docs/reliability.md "Watchdog").
//
// In a synchronous gang every rank's step takes the same wall time: the
// fast ranks wait for the slow one inside the collectives. So a rank is
// judged by its own time in the step, the wall time less what it spent in
// collectives (worker/train/collectives/step_phase.h), which the ranks share
// after each step (Trainer). A rank whose own time is above `factor` times
// the median of the other ranks' for `window` steps in a row becomes a
// straggler; one that then stays at or below it for `window` steps in a row
// stops being one. Each change is one StragglerReport.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_STRAGGLER_WATCH_H_
#define BALLAST_WORKER_TRAIN_TRAINER_STRAGGLER_WATCH_H_

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "ballast/v1/job.pb.h"

namespace ballast::train {

class StragglerWatch {
 public:
  // factor > 1 and window >= 1 (the spec's watchdog, validated).
  StragglerWatch(double factor, int32_t window) : factor_(factor), window_(window) {}

  // Every rank's own time in step `step`, in seconds, by rank; returns the
  // reports of the ranks that became or stopped being stragglers with it.
  std::vector<v1::StragglerReport> Observe(int64_t step, const std::vector<double>& own_s);

 private:
  struct Rank {
    bool straggling = false;
    // Steps in a row that count towards the change (slow, or fast again).
    int32_t run = 0;
    // The window's (own, others' median) pairs, newest last.
    std::deque<std::pair<double, double>> recent;
  };

  const double factor_;
  const int32_t window_;
  std::vector<Rank> ranks_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_STRAGGLER_WATCH_H_
