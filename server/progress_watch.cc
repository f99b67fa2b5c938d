#include "server/progress_watch.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec_rules.h"

namespace ballast::server {
namespace {

// Steps the median is taken over: enough that a slow checkpoint step or two
// do not move it, few enough to follow a job whose steps grow.
constexpr size_t kStepsInMedian = 101;

// A stored spec from before the watchdog holds its zeros.
double OrDefault(double value, double fallback) { return value > 0 ? value : fallback; }

std::string Where(const v1::RankPhase& p) {
  const std::string layer = p.layer() >= 0 ? absl::StrCat(" of layer ", p.layer()) : "";
  if (p.phase() == "data") return "reading data";
  if (p.phase() == "forward") return absl::StrCat("in the forward", layer);
  if (p.phase() == "backward") return absl::StrCat("in the backward", layer);
  if (p.phase() == "collective") {
    return absl::StrCat("in ", p.collective(), " #", p.collective_seq(), layer);
  }
  if (p.phase() == "optimizer") return "in the optimizer step";
  if (p.phase() == "checkpoint") return "writing a checkpoint";
  if (p.phase() == "eval") return "evaluating";
  if (p.phase() == "export") return "exporting";
  return absl::StrCat("in ", p.phase());
}

}  // namespace

void ProgressWatch::Observe(int32_t attempt, int32_t rank, const v1::TrainingEvent& event,
                            int64_t now_ms) {
  if (attempt != attempt_) {
    *this = ProgressWatch();
    attempt_ = attempt;
  }
  if (event.has_phase()) {
    phases_[rank] = event.phase();
    phases_[rank].set_rank(rank);
  }
  if (!event.has_step_metrics()) return;
  last_step_ms_ = now_ms;
  last_step_ = std::max(last_step_, event.step_metrics().step());
  if (rank != 0) return;
  step_times_s_.push_back(event.step_metrics().step_time_s());
  if (step_times_s_.size() > kStepsInMedian) step_times_s_.pop_front();
}

std::optional<v1::StallReport> ProgressWatch::Stalled(int32_t attempt, const v1::WatchdogSpec& spec,
                                                      int32_t ranks, int64_t now_ms) const {
  if (attempt != attempt_ || last_step_ms_ == 0) return std::nullopt;
  std::vector<double> times(step_times_s_.begin(), step_times_s_.end());
  double median = 0;
  if (!times.empty()) {
    const auto mid = times.begin() + static_cast<std::ptrdiff_t>(times.size() / 2);
    std::nth_element(times.begin(), mid, times.end());
    median = *mid;
  }
  const double bound_s =
      std::max(OrDefault(spec.stall_floor_s(), SpecDefaultNumber("watchdog.stall_floor_s")),
               OrDefault(spec.stall_factor(), SpecDefaultNumber("watchdog.stall_factor")) * median);
  const double waited_s = static_cast<double>(now_ms - last_step_ms_) / 1000;
  if (waited_s <= bound_s) return std::nullopt;
  v1::StallReport report;
  report.set_step(last_step_ + 1);
  report.set_waited_s(waited_s);
  report.set_bound_s(bound_s);
  for (int32_t r = 0; r < ranks; ++r) {
    const auto it = phases_.find(r);
    v1::RankPhase* phase = report.add_ranks();
    if (it != phases_.end()) *phase = it->second;
    phase->set_rank(r);
  }
  return report;
}

std::string ProgressWatch::Describe(const v1::StallReport& report, int64_t now_ms) {
  std::string out =
      absl::StrFormat("no rank completed step %d in %.1f s (bound %.1f s):", report.step(),
                      report.waited_s(), report.bound_s());
  for (const v1::RankPhase& p : report.ranks()) {
    absl::StrAppend(&out, p.rank() == report.ranks(0).rank() ? " " : "; ", "rank ", p.rank(), " ");
    if (p.phase().empty()) {
      // Its phases moved faster than the channel reports them (agent_channel.h).
      absl::StrAppend(&out, "held no phase long enough to report one");
      continue;
    }
    absl::StrAppend(
        &out, Where(p), p.step() != report.step() ? absl::StrCat(" (step ", p.step(), ")") : "",
        absl::StrFormat(" for %.1f s", static_cast<double>(now_ms - p.since_ms()) / 1000));
  }
  return out;
}

}  // namespace ballast::server
