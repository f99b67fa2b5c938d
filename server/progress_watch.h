// ProgressWatch: the coordinator's progress watchdog for one job
// (docs/reliability.md, "Watchdog"): it declares the job stalled when no
// rank has completed a step for stall_factor times the median step time,
// and at least stall_floor_s, and says where every rank was.
//
// Why in the coordinator: a hang in a gang shows on every rank at once
// (rank 1 waits in an all-gather for rank 0, which is stuck reading data),
// and the ranks may run on several workers, each of which sees its own
// alone. The coordinator hears every rank's steps and held phases
// (worker/train/rank/agent_channel.h), owns the job's restarts and counts
// them, and keeps judging a job whose ranks and worker are all alive, which
// is what neither the collective timeout (a peer's heartbeat stands still)
// nor the worker's lease (its agent stops) catches.
//
// The watch is armed by the attempt's first completed step: loading a model
// and the first step's warm-up are not judged. Before the first step of an
// attempt a hang is left to the collective timeout and the lease.
//
// Thread-compatible: the Coordinator calls it under its lock.
#ifndef BALLAST_SERVER_PROGRESS_WATCH_H_
#define BALLAST_SERVER_PROGRESS_WATCH_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast::server {

class ProgressWatch {
 public:
  // A current-attempt training event of `rank`, at `now_ms`; an event of a
  // newer attempt than the last one seen starts the watch afresh.
  void Observe(int32_t attempt, int32_t rank, const v1::TrainingEvent& event, int64_t now_ms);

  // The stall of attempt `attempt`, with every one of `ranks` ranks' last
  // phase, once no step of it has completed for the bound; nullopt before
  // (and for an attempt that has reported nothing yet).
  std::optional<v1::StallReport> Stalled(int32_t attempt, const v1::WatchdogSpec& spec,
                                         int32_t ranks, int64_t now_ms) const;

  // The report in words, for the job's failure reason: "no rank completed
  // step 5 in 12.0 s (bound 10.0 s): rank 0 reading data for 12.1 s; rank 1
  // in all_reduce #23 for 12.0 s".
  static std::string Describe(const v1::StallReport& report, int64_t now_ms);

 private:
  int32_t attempt_ = -1;
  // When a rank last completed a step (0: none yet this attempt), and the
  // newest step completed.
  int64_t last_step_ms_ = 0;
  int64_t last_step_ = 0;
  // The newest steps' times (rank 0's, which every rank shares in a
  // synchronous gang), for the median.
  std::deque<double> step_times_s_;
  std::map<int32_t, v1::RankPhase> phases_;
};

}  // namespace ballast::server

#endif  // BALLAST_SERVER_PROGRESS_WATCH_H_
