// JobEntry: what the coordinator holds in memory for one job, and the words
// shared by the classes that read it (the coordinator, JobHistory,
// JobMetrics, EventWatch). Plain data: whoever holds a JobEntry guards it
// (the Coordinator, with its mutex). A JobEntry is neither copied nor moved
// (its histograms cannot be): the coordinator keeps each where it made it.
#ifndef BALLAST_SERVER_JOB_ENTRY_H_
#define BALLAST_SERVER_JOB_ENTRY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ballast/v1/job.pb.h"
#include "prometheus/histogram.h"
#include "server/event_fanout.h"
#include "server/progress_watch.h"
#include "server/scheduler.h"
#include "server/store.h"

namespace ballast::server {

// SUCCEEDED, FAILED or CANCELLED: the job will not change again.
bool Terminal(v1::JobState s);

// "queued" for JOB_STATE_QUEUED: the word users see in reasons and labels.
std::string StateName(v1::JobState s);

// Bounds, in seconds, of ballast_rank_step_seconds: from a tiny model's step
// on CPU to a large model's on many ranks.
const std::vector<double>& StepSecondsBounds();

// What one rank of a job reported for itself, for the ballast_rank_*
// series; since ballastd started, like the guard counters.
struct RankSeries {
  prometheus::Histogram step_seconds{StepSecondsBounds()};
  // The newest report; 0 when the rank does not measure it.
  int64_t peak_memory_bytes = 0;
  double communicated_bytes = 0;
  // Of communicated_bytes, those sent to replicas (hybrid sharding).
  double replica_communicated_bytes = 0;
  // Seconds blocked on collectives, summed over steps.
  double collective_wait_seconds = 0;
};

struct JobEntry {
  JobRecord record;
  // By rank number, across attempts.
  std::map<int32_t, RankSeries> ranks;
  std::shared_ptr<EventFanout> fanout;
  // Events made since the last Flush.
  std::vector<v1::JobEvent> unflushed;
  bool dirty = false;
  // When it last entered QUEUED (now_ms() time), for the queue-wait histogram.
  int64_t queued_since_ms = 0;
  // The current attempt's progress, for the watchdog.
  ProgressWatch watch;
};

// Folds what the coordinator interprets of a current-attempt training event
// of `rank` into `job` (its step, guard counters, checkpoint, data, eval,
// stragglers and their devices, and the rank's series). False when the
// event is to be dropped: another rank's copy of what rank 0 reports for
// the job.
bool ApplyTrainingEvent(JobEntry* job, int32_t rank, const v1::TrainingEvent& event);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_JOB_ENTRY_H_
