// MetricsLog: OUT/metrics.jsonl, one JSON object per optimizer step:
//   {"step", "loss", "grad_norm", "lr", "tokens", "supervised_tokens",
//    "step_time_s", "skipped"[, "skip_reason"]}
// "loss" is null for a step without supervised tokens (never 0 or NaN), and
// "grad_norm" null when it is not finite.
//
// The log always agrees with the state training continues from: opening it
// at a step (a resume) or going back to one (a rollback) drops the lines of
// later steps, which will run again.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_METRICS_LOG_H_
#define BALLAST_WORKER_TRAIN_TRAINER_METRICS_LOG_H_

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace ballast::train {

// One optimizer step as the trainer measured it.
struct StepRecord {
  int64_t step = 0;            // 1-based: optimizer steps completed after this one
  std::optional<double> loss;  // token loss sum / supervised tokens; none without any
  double grad_norm = 0;        // before clipping; 0 for a step skipped before the forward
  double lr = 0;
  int64_t tokens = 0;  // all micro-batches, all ranks
  int64_t supervised_tokens = 0;
  double step_time_s = 0;
  bool skipped = false;     // the update never reached the weights
  std::string skip_reason;  // why, when skipped
  // This rank's, reported in events, not in metrics.jsonl.
  int64_t communicated_bytes = 0;  // sent in collectives during the step
  int64_t peak_memory_bytes = 0;   // peak resident memory of the process so far
};

class MetricsLog {
 public:
  // Opens `path` for appending after dropping the lines of steps after
  // `step`. INTERNAL names the file when it cannot be rewritten.
  static absl::StatusOr<MetricsLog> Open(const std::string& path, int64_t step);

  // Appends one line and flushes it. INTERNAL when the write fails.
  absl::Status Append(const StepRecord& record);
  // Drops the lines of steps after `step` (a rollback) and keeps appending.
  absl::Status TruncateAfter(int64_t step);

 private:
  explicit MetricsLog(std::string path) : path_(std::move(path)) {}

  std::string path_;
  std::ofstream out_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_METRICS_LOG_H_
