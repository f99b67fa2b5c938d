// RankObserver: the TrainingObserver ballast-train hands its Trainer.
//
// Under a coordinator it commits each report through the attempt's output
// before it forwards the report to the worker's channel, so the coordinator
// never hears of a step or checkpoint that is not in the job's output folder.
// It asks the trainer to stop at the next step boundary on a Cancel from the
// worker, on SIGTERM (see CatchSigterm), or once a commit has failed (a newer
// attempt took the output folder over: nothing more is written). Before
// each report it lets the gang's collectives fence a rank that was stopped
// past the collective timeout (Collectives::FenceIfStalled).
//
// Not thread-safe: the training thread calls it.
#ifndef BALLAST_WORKER_TRAIN_RANK_RANK_OBSERVER_H_
#define BALLAST_WORKER_TRAIN_RANK_RANK_OBSERVER_H_

#include <string>

#include "absl/status/status.h"
#include "worker/train/collectives/collectives.h"
#include "worker/train/rank/agent_channel.h"
#include "worker/train/rank/attempt_output.h"
#include "worker/train/trainer/training_observer.h"

namespace ballast::train {

class RankObserver : public TrainingObserver {
 public:
  // From now on the first SIGTERM asks every RankObserver to stop at the
  // next step boundary; a second one kills the process, as SIGTERM's default
  // action would.
  static void CatchSigterm();

  // `channel` (reports go nowhere when null), `output` (null: the trainer
  // writes straight into the job's folder) and `gang` are not owned and
  // must outlive this.
  RankObserver(AgentChannel* channel, AttemptOutput* output, Collectives* gang)
      : channel_(channel), output_(output), gang_(gang) {}

  // OK, or the failed commit that stopped the run (ABORTED: superseded).
  const absl::Status& commit_status() const { return commit_status_; }

  // Commits a step's metrics.jsonl lines (and at the training's end, the
  // lines after the last step's), and a saved checkpoint, before it forwards
  // them; after a failed commit, steps, the end, guard events and
  // checkpoints are dropped, and every other kind still goes up.
  void OnEvent(const v1::TrainingEvent& event) override;
  bool StopRequested() override;

 private:
  // Keeps the first failure; reports after it are dropped.
  void CommitFailed(const absl::Status& status);

  AgentChannel* const channel_;
  AttemptOutput* const output_;
  Collectives* const gang_;
  absl::Status commit_status_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_RANK_RANK_OBSERVER_H_
