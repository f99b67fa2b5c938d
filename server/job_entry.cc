#include "server/job_entry.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"

namespace ballast::server {

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

std::string StateName(v1::JobState s) {
  return absl::AsciiStrToLower(absl::StripPrefix(v1::JobState_Name(s), "JOB_STATE_"));
}

const std::vector<double>& StepSecondsBounds() {
  static const std::vector<double> bounds = {0.01, 0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                             5,    10,   30,  60,   120, 300};
  return bounds;
}

bool ApplyTrainingEvent(JobEntry* job, int32_t rank, const v1::TrainingEvent& e) {
  v1::Job& j = job->record.job;
  switch (e.kind_case()) {
    case v1::TrainingEvent::kStepMetrics: {
      const v1::StepMetrics& m = e.step_metrics();
      RankSeries& series = job->ranks[rank];
      series.step_seconds.Observe(m.step_time_s());
      series.peak_memory_bytes = m.peak_memory_bytes();
      series.communicated_bytes += static_cast<double>(m.communicated_bytes());
      series.replica_communicated_bytes += static_cast<double>(m.replica_communicated_bytes());
      series.collective_wait_seconds += m.collective_wait_s();
      // Every rank reports the same global step; rank 0 speaks for the job,
      // so N ranks neither count a step N times nor move it back and forth.
      if (rank != 0) return false;
      j.set_step(e.step_metrics().step());
      *j.mutable_last_step() = e.step_metrics();
      if (m.skipped()) j.set_skipped_steps(j.skipped_steps() + 1);
      // The trainer has resumed: a rollback target is used up. Not by the
      // steps the ranks asked to roll back still finish before they stop.
      if (j.state() != v1::JOB_STATE_ROLLING_BACK) job->record.resume_at_or_before.reset();
      break;
    }
    case v1::TrainingEvent::kGuard: {
      if (rank != 0) return false;
      const v1::GuardEvent& g = e.guard();
      if (g.kind() == v1::GuardEvent::KIND_ROLLBACK) j.set_guard_rollbacks(j.guard_rollbacks() + 1);
      // One event per bad step (skipped, recovered, rolled back or
      // diagnosed) or refused checkpoint, each naming its trigger.
      if (!g.trigger().empty()) (*j.mutable_anomalies())[g.trigger()] += 1;
      *j.mutable_last_guard_event() = g;
      break;
    }
    case v1::TrainingEvent::kCheckpointSaved:
      if (rank != 0) return false;
      j.set_checkpoint_step(e.checkpoint_saved().step());
      break;
    case v1::TrainingEvent::kData:
      if (rank != 0) return false;
      *j.mutable_data() = e.data();
      break;
    case v1::TrainingEvent::kEval:
      if (rank != 0) return false;
      *j.mutable_last_eval() = e.eval();
      break;
    case v1::TrainingEvent::kEnd:
      if (rank != 0) return false;
      *j.mutable_end() = e.end();
      break;
    case v1::TrainingEvent::kStall:
      j.set_stalls(j.stalls() + 1);
      *j.mutable_last_stall() = e.stall();
      break;
    case v1::TrainingEvent::kStraggler: {
      const v1::StragglerReport& s = e.straggler();
      auto* ranks = j.mutable_straggler_ranks();
      const auto at = std::find(ranks->begin(), ranks->end(), s.rank());
      if (s.straggling() && at == ranks->end()) ranks->Add(s.rank());
      if (!s.straggling() && at != ranks->end()) ranks->erase(at);
      // A rank that keeps up again still marks its device: it was slow there.
      if (!s.straggling()) break;
      // Kept over attempts (Job.straggler_devices), in worker and device
      // order, so that a later attempt does not return to a device that was slow.
      for (const v1::RankPlacement& p : j.placement()) {
        if (p.rank() != s.rank()) continue;
        auto* devices = j.mutable_straggler_devices();
        auto at = std::find_if(devices->begin(), devices->end(), [&](const auto& d) {
          return d.worker_id() == p.worker_id() && d.device() == p.device();
        });
        v1::StragglerDevice* d = at != devices->end() ? &*at : devices->Add();
        d->set_worker_id(p.worker_id());
        d->set_device(p.device());
        d->set_rank(s.rank());
        d->set_attempt(job->record.attempt);
        std::sort(devices->begin(), devices->end(), [](const auto& x, const auto& y) {
          return x.worker_id() != y.worker_id() ? x.worker_id() < y.worker_id()
                                                : x.device() < y.device();
        });
      }
      break;
    }
    // A rank's phase is the watchdog's input, not the job's state.
    case v1::TrainingEvent::kPhase:
    case v1::TrainingEvent::kLog:
    // A kind newer than this coordinator: its unknown fields travel along, so
    // a watcher that knows it can read it.
    case v1::TrainingEvent::KIND_NOT_SET:
      break;
  }
  return true;
}

}  // namespace ballast::server
