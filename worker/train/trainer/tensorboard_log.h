// TensorBoardLog: rank 0's TensorBoard event file, for a spec with
// `report_to: [tensorboard]`: OUT/tensorboard/events.out.tfevents.<unix
// seconds, 10 digits>.<hostname>.<pid>, the name TensorBoard's own writer
// gives (its readers take any name holding "tfevents", in name order). The
// records (io/record_file.h) are tensorboard.Event messages
// (proto/tensorboard/event.proto):
//   - the file's version, "brain.Event:2", first;
//   - a session start (SessionLog START) at the next step to run (the step
//     resumed or rolled back to, + 1): when the process starts, and after a
//     rollback;
//   - per optimizer step, its scalars as simple_value (float32, as every
//     TensorBoard writer stores scalars): train/loss, train/grad_norm,
//     train/lr and train/tokens_per_s, named as in metrics.jsonl; loss and
//     grad_norm only when metrics.jsonl has a number for them (not null);
//   - per evaluation, eval/loss (the validation loss; left out when the
//     rows eval.max_tokens kept have no supervised token), or a reranker's
//     eval/mrr_at_10 and eval/ndcg_at_10, at the step evaluated;
//   - the guard's events as text summaries (the text dashboard), tagged
//     guard/<kind> at the bad step.
//
// Restarts and rollbacks. Every process start writes a new file, so a file is
// only ever appended to by one process, and a torn last record (a crash) is
// at the end of a file no one appends to again. The steps after the resume
// or rollback point were reported once and run again: TensorBoard shows the
// state training continues from, like metrics.jsonl, in both of its readers.
// The Python one (plugin_event_accumulator, behind the dashboards of
// `tensorboard --load_fast=false`) drops every point at or after a session
// start's step when it meets one; the Rust data server (the default
// `tensorboard --logdir`) drops a tag's points at or after a step when a new
// point of that tag arrives at it. The guard's text events of the rolled-back
// steps (say a skip before the rollback) are dropped by the first, and kept by
// the second until the tag is written again at or before their step. (The
// classic EventAccumulator API drops the scalars alone, never tensors, text
// included.)
//
// A write goes to the kernel before the call returns, so a running job's
// curves move in TensorBoard step by step. Under a coordinator `dir` is in
// the attempt's own folder, and rank/attempt_output.h commits the records to
// the job's OUT/tensorboard/ with each report, as it does metrics.jsonl.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_TRAINER_TENSORBOARD_LOG_H_
#define BALLAST_WORKER_TRAIN_TRAINER_TENSORBOARD_LOG_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job.pb.h"
#include "worker/train/io/record_file.h"

namespace tensorboard {
class Event;
}  // namespace tensorboard

namespace ballast::train {

class TensorBoardLog {
 public:
  // The file name a process started at `unix_seconds` on `hostname` with
  // `pid` writes.
  static std::string FileName(int64_t unix_seconds, absl::string_view hostname, int64_t pid);

  // Creates `dir` if missing and a new event file in it, holding the version
  // record and a session start after `step` (the step training resumes
  // from; 0 for a new job). The errno's status naming the folder or file
  // when one cannot be made or written.
  static absl::StatusOr<TensorBoardLog> Open(const std::string& dir, int64_t step);

  // The scalars of one optimizer step, applied or skipped.
  absl::Status Step(const v1::StepMetrics& metrics);
  // The scalars of one evaluation at its step: eval/loss, or a reranker's
  // eval/mrr_at_10 and eval/ndcg_at_10.
  absl::Status Eval(const v1::EvalReport& report);
  // `text` as a text summary tagged `tag` at `step`.
  absl::Status Text(absl::string_view tag, int64_t step, absl::string_view text);
  // A rollback to `step`: a session start after it, so that readers drop the
  // points of the steps that will run again.
  absl::Status RestartAfter(int64_t step);

  const std::string& path() const { return file_.path(); }

 private:
  explicit TensorBoardLog(RecordFile file) : file_(std::move(file)) {}

  absl::Status Write(tensorboard::Event& event);

  RecordFile file_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_TRAINER_TENSORBOARD_LOG_H_
