// MetricsLog: OUT/metrics.jsonl, one JSON object per optimizer step: its
// v1::StepMetrics through the proto-JSON mapping (common/proto_json.h: the
// proto's field names, every field printed), so that a field added to
// StepMetrics reaches the file too:
//   {"step", "max_steps", "loss", "grad_norm", "lr", "tokens",
//    "supervised_tokens", "tokens_per_s", "step_time_s", "skipped",
//    "peak_memory_bytes", "communicated_bytes", "aux_loss"[, "moe"],
//    "collective_wait_s", "replica_communicated_bytes"[, "skip_reason"]}
// "aux_loss" is null and "moe" absent for a dense model; "moe" is a Mixture-
// of-Experts model's routing: {"expert_load_max_ratio", "layers": [{"layer",
// "expert_load_max_ratio", "idle_expert_fraction", "router_entropy",
// "top_k_share"}]}.
// Two forms differ from the mapping's and keep the file's since its first
// line, which its readers (scripts, tests, the resume below) do arithmetic
// on: 64-bit integers are JSON numbers, not strings, and a double that is
// absent or not finite is null, in "moe" too ("loss" for a step without supervised tokens,
// never 0 or NaN; "grad_norm" when it is not finite). "skip_reason", the
// guard's reason, is there only for a skipped step.
// An evaluation of eval.path adds a line of its own after its step's (or
// first, for step 0): {"step", "eval": {"step", "loss", "tokens",
// "supervised_tokens", "time_s", ...}}, its v1::EvalReport in the same forms;
// a reader of steps skips the lines that hold "eval".
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
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job.pb.h"

namespace ballast::train {

class MetricsLog {
 public:
  // Opens `path` for appending after dropping the lines of steps after
  // `step`. INTERNAL names the file when it cannot be rewritten.
  static absl::StatusOr<MetricsLog> Open(const std::string& path, int64_t step);

  // Appends one step's line, with `skip_reason` when it is not empty, and
  // flushes it. INTERNAL when the write fails.
  absl::Status Append(const v1::StepMetrics& metrics, absl::string_view skip_reason);
  // Appends an evaluation's line and flushes it. INTERNAL as Append.
  absl::Status AppendEval(const v1::EvalReport& report);
  // Drops the lines of steps after `step` (a rollback) and keeps appending.
  absl::Status TruncateAfter(int64_t step);

 private:
  explicit MetricsLog(std::string path) : path_(std::move(path)) {}
  absl::Status Write(const nlohmann::json& line);

  std::string path_;
  std::ofstream out_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_METRICS_LOG_H_
