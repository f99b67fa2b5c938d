// Reporter: where a rank's reports go. Each one is a v1::TrainingEvent to
// the TrainingObserver (the job's event stream under a worker); guard events
// and log lines also go to the rank's log (stderr), and step metrics to
// rank 0's metrics.jsonl (metrics_log.h). With `report_to: [tensorboard]`,
// rank 0 also writes the step metrics and guard events to a TensorBoard event
// file (tensorboard_log.h). Reports about the whole job (the data,
// evaluations, saved checkpoints, metrics.jsonl, TensorBoard) come from rank 0
// alone; every rank sends its step metrics, guard events and log lines.
//
// Thread-compatible: the training thread calls it.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_REPORTER_H_
#define BALLAST_WORKER_TRAIN_TRAINER_REPORTER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_spec.pb.h"
#include "worker/train/guard/guard.h"
#include "worker/train/recovery/trained_state.h"
#include "worker/train/trainer/metrics_log.h"
#include "worker/train/trainer/tensorboard_log.h"
#include "worker/train/trainer/training_observer.h"

namespace ballast::train {

class Reporter {
 public:
  // `observer` (null: reports go nowhere) is not owned and must outlive the
  // Reporter. `data_path` is the file a diagnosis's document lines are of.
  Reporter(TrainingObserver* observer, int rank, std::string data_path);

  // Where the run starts (`checkpoint`: the folder it resumed from, empty
  // for step 0), the faults it injects, and what data it reads.
  void RunStarts(const v1::JobSpec& spec, int64_t step, const std::string& checkpoint,
                 const std::string& faults, const v1::DataReport& data);
  // Rank 0: opens OUT/metrics.jsonl in `out_dir`, dropping the lines after
  // `step`, and a new TensorBoard event file in OUT/tensorboard/ when
  // `spec` reports to tensorboard. INTERNAL or the errno's status names the
  // file that cannot be rewritten or made.
  absl::Status OpenMetrics(const std::string& out_dir, const v1::JobSpec& spec, int64_t step);
  // After every optimizer step: a log line of this rank's traffic in
  // collectives the first time it has any, its line in metrics.jsonl (with the
  // verdict's reason when skipped), its metrics to the observer, and
  // `anomaly` as a guard event when the step was skipped or recovered by a
  // re-run (a rollback reports itself). INTERNAL when the line cannot be
  // written, or an error of the TensorBoard file's since the last step.
  absl::Status Step(const v1::StepMetrics& metrics, const GuardVerdict& verdict,
                    const v1::GuardEvent& anomaly);
  // A rollback to `step`: metrics.jsonl drops the lines after it, and
  // TensorBoard's readers the points (tensorboard_log.h).
  absl::Status TruncateMetricsAfter(int64_t step);

  void Guard(const v1::GuardEvent& event);
  // A rollback of `event` (the bad step, with where the state came from and
  // the documents skipped) to step `to_step`, for `reason`; `lr_cut` is
  // guard.lr_cut.
  void RolledBack(v1::GuardEvent event, const std::string& reason, int64_t to_step, double lr_cut);
  // Reports `event` (the bad step) as a diagnosis built from `reason`, its
  // tensor, its re-run and its documents, and returns the diagnosis as
  // FAILED_PRECONDITION.
  absl::Status Diagnose(v1::GuardEvent event, const std::string& reason);
  // A checkpoint of `step` that was refused for a non-finite state.
  void CheckpointRefused(int64_t step, absl::string_view why);
  // Rank 0: a checkpoint folder now in place.
  void CheckpointSaved(int64_t step, const std::string& dir);
  // Rank 0: the data report, at the start and at each epoch.
  void Data(v1::DataReport report, int64_t epoch);
  // An evaluation of the held-out set: a log line, and (rank 0) its report
  // and, for eval.path's loss, its line in metrics.jsonl. INTERNAL when the
  // line cannot be written.
  absl::Status Eval(const v1::EvalReport& report);
  // Rank 0: how training ended and what is exported, before the export.
  void End(const v1::TrainingEnd& end);
  // A line for the rank's log and the job's event stream; `level` is
  // "info", "warning" or "error".
  void Log(const std::string& level, const std::string& text);
  // A rank that became or stopped being a straggler (straggler_watch.h),
  // as an event and a log line.
  void Straggler(const v1::StragglerReport& report);

  bool StopRequested() { return observer_->StopRequested(); }
  // Whether this rank writes the job's shared files (rank 0).
  bool writes_shared_files() const { return rank_ == 0; }

 private:
  void Send(v1::TrainingEvent event) { observer_->OnEvent(event); }

  NullObserver null_observer_;
  TrainingObserver* const observer_;
  const int rank_;
  const std::string data_path_;
  std::optional<MetricsLog> metrics_;
  std::optional<TensorBoardLog> tensorboard_;
  // The first failed write to tensorboard_ from a call that returns no
  // status (Guard); the next Step returns it.
  absl::Status tensorboard_status_;
  bool traffic_logged_ = false;
};

// The guard event of a step the guard did not apply as it came: a skip of
// the step `health` judged, with its trigger, the first non-finite tensor
// and its rank, and the global norms of the non-finite tensors, then of the
// largest finite ones (an exploding neighbour is often the cause).
v1::GuardEvent DescribeAnomaly(const TensorNorms& norms, const StepHealth& health,
                               const GuardVerdict& verdict);

// The documents from data position `first` that `event` makes the job skip,
// given their lines in the data file: their count and the first 64 lines.
void SetSkippedDocuments(int64_t first, const std::vector<int64_t>& lines, v1::GuardEvent* event);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_REPORTER_H_
