#include "worker/train/trainer/reporter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <limits>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "worker/train/data/training_data.h"

namespace ballast::train {

namespace fs = std::filesystem;

Reporter::Reporter(TrainingObserver* observer, int rank, std::string data_path)
    : observer_(observer != nullptr ? observer : &null_observer_),
      rank_(rank),
      data_path_(std::move(data_path)) {}

void Reporter::RunStarts(const v1::JobSpec& spec, int64_t step, const std::string& checkpoint,
                         const std::string& faults, const v1::DataReport& data) {
  Log("info", checkpoint.empty() ? absl::StrCat("starting at step 0 of ", spec.max_steps())
                                 : absl::StrCat("resuming from checkpoint step ", step, " (",
                                                checkpoint, ") to step ", spec.max_steps()));
  if (!faults.empty()) Log("warning", faults);
  Log("info",
      absl::StrCat("data: ", spec.data().path(), " as ", data.format(),
                   spec.data().format().empty() ? " (detected from its first record)" : "",
                   data.template_().empty() ? "" : absl::StrCat(", template ", data.template_()),
                   spec.data().template_().empty() && !data.template_().empty()
                       ? " (from the tokenizer_config.json)"
                       : "",
                   data.tokenized() ? "; tokenized into the job's token cache"
                                    : "; read from the job's token cache"));
  if (const std::string note = SpecialTokenRecordsNote(data); !note.empty()) {
    Log("info", absl::StrCat("data: ", note));
  }
}

absl::Status Reporter::OpenMetrics(const std::string& out_dir, const v1::JobSpec& spec,
                                   int64_t step) {
  // One metrics.jsonl per job: every rank computes the same step metrics.
  if (!writes_shared_files()) return absl::OkStatus();
  absl::StatusOr<MetricsLog> opened =
      MetricsLog::Open((fs::path(out_dir) / "metrics.jsonl").string(), step);
  if (!opened.ok()) return opened.status();
  metrics_ = *std::move(opened);
  if (absl::c_linear_search(spec.report_to(), "tensorboard")) {
    absl::StatusOr<TensorBoardLog> tensorboard =
        TensorBoardLog::Open((fs::path(out_dir) / "tensorboard").string(), step);
    if (!tensorboard.ok()) return tensorboard.status();
    tensorboard_ = *std::move(tensorboard);
  }
  return absl::OkStatus();
}

absl::Status Reporter::Step(const v1::StepMetrics& metrics, const GuardVerdict& verdict,
                            const v1::GuardEvent& anomaly) {
  if (metrics_) {
    absl::Status s = metrics_->Append(metrics, metrics.skipped() ? verdict.reason : "");
    if (!s.ok()) return s;
  }
  if (tensorboard_) {
    tensorboard_status_.Update(tensorboard_->Step(metrics));
    if (!tensorboard_status_.ok()) return tensorboard_status_;
  }
  if (metrics.communicated_bytes() > 0 && !traffic_logged_) {
    // Every step moves the same bytes; events carry each step's figure.
    Log("info", absl::StrCat("rank ", rank_, " sent ", metrics.communicated_bytes(),
                             " bytes in collectives in step ", metrics.step()));
    traffic_logged_ = true;
  }
  v1::TrainingEvent event;
  *event.mutable_step_metrics() = metrics;
  Send(std::move(event));
  if (verdict.action == GuardAction::kSkip || verdict.rerun == RerunVerdict::kTransient) {
    Guard(anomaly);
  }
  return absl::OkStatus();
}

absl::Status Reporter::TruncateMetricsAfter(int64_t step) {
  if (metrics_) {
    if (absl::Status s = metrics_->TruncateAfter(step); !s.ok()) return s;
  }
  return tensorboard_ ? tensorboard_->RestartAfter(step) : absl::OkStatus();
}

// A line to the rank's log (stderr) for a standalone run, the same line to
// TensorBoard's text dashboard, then the event to the job's stream (where
// `ballast watch` prints it); under a worker, the event commits the line.
void Reporter::Guard(const v1::GuardEvent& event) {
  std::string kind = v1::GuardEvent::Kind_Name(event.kind());
  kind = absl::AsciiStrToLower(absl::StripPrefix(kind, "KIND_"));
  const std::string line =
      absl::StrCat("guard ", kind, " at step ", event.step(), ": ", event.message());
  std::cerr << "ballast-train: " << line << std::endl;
  if (tensorboard_) {
    tensorboard_status_.Update(
        tensorboard_->Text(absl::StrCat("guard/", kind), event.step(), line));
  }
  v1::TrainingEvent out;
  *out.mutable_guard() = event;
  Send(std::move(out));
}

void Reporter::RolledBack(v1::GuardEvent event, const std::string& reason, int64_t to_step,
                          double lr_cut) {
  event.set_kind(v1::GuardEvent::KIND_ROLLBACK);
  event.set_to_step(to_step);
  event.set_steps_lost(event.step() - to_step);
  event.set_message(absl::StrCat(
      reason, "; rolled back to step ", to_step, " (", event.restored_from(), "), skipping the ",
      event.documents_skipped(), " documents read since it",
      lr_cut < 1 ? absl::StrCat("; the LR is cut to ", lr_cut, " of the schedule's") : ""));
  Guard(event);
}

absl::Status Reporter::Diagnose(v1::GuardEvent event, const std::string& reason) {
  event.set_kind(v1::GuardEvent::KIND_DIAGNOSIS);
  std::string diagnosis = absl::StrCat("guard: step ", event.step(), ": ", reason);
  if (!event.module().empty()) {
    absl::StrAppend(&diagnosis, "; first non-finite gradient: ", event.module(), " on rank ",
                    event.rank());
  }
  switch (event.verdict()) {
    case v1::GuardEvent::VERDICT_DETERMINISTIC:
      absl::StrAppend(&diagnosis,
                      "; deterministic: a re-run on the same state and batch was as bad, so the "
                      "weights or the data cause it");
      break;
    case v1::GuardEvent::VERDICT_TRANSIENT:
      absl::StrAppend(&diagnosis, "; transient: a re-run was healthy");
      break;
    default:
      break;
  }
  if (event.document_ids_size() > 0) {
    absl::StrAppend(&diagnosis, "; the step's documents (lines of ", data_path_,
                    ", from 0): ", absl::StrJoin(event.document_ids(), ","));
  }
  event.set_message(diagnosis);
  Guard(event);
  return absl::FailedPreconditionError(diagnosis);
}

void Reporter::CheckpointRefused(int64_t step, absl::string_view why) {
  v1::GuardEvent refused;
  refused.set_kind(v1::GuardEvent::KIND_CHECKPOINT_REFUSED);
  refused.set_step(step);
  refused.set_trigger(TriggerName(GuardTrigger::kNonFinite));
  refused.set_rank(-1);
  refused.set_message(std::string(why));
  Guard(refused);
}

void Reporter::CheckpointSaved(int64_t step, const std::string& dir) {
  if (!writes_shared_files()) return;
  v1::TrainingEvent event;
  event.mutable_checkpoint_saved()->set_step(step);
  event.mutable_checkpoint_saved()->set_path(dir);
  Send(std::move(event));
}

void Reporter::Data(v1::DataReport report, int64_t epoch) {
  if (!writes_shared_files()) return;
  report.set_epoch(epoch);
  v1::TrainingEvent event;
  *event.mutable_data() = std::move(report);
  Send(std::move(event));
}

absl::Status Reporter::Eval(const v1::EvalReport& report) {
  std::string line =
      report.has_loss()
          ? absl::StrFormat("eval step %d: loss %.6f over %d supervised tokens (%d tokens, %.3f s)",
                            report.step(), report.loss(), report.supervised_tokens(),
                            report.tokens(), report.time_s())
          : absl::StrFormat("eval step %d: MRR@10 %.4f, NDCG@10 %.4f over %d held-out groups",
                            report.step(), report.mrr_at_10(), report.ndcg_at_10(),
                            report.groups());
  if (report.best()) absl::StrAppend(&line, "; the best so far, kept in ", report.checkpoint());
  Log("info", line);
  if (!writes_shared_files()) return absl::OkStatus();
  v1::TrainingEvent event;
  *event.mutable_eval() = report;
  Send(std::move(event));
  if (metrics_) {
    if (absl::Status s = metrics_->AppendEval(report); !s.ok()) return s;
  }
  if (tensorboard_) {
    tensorboard_status_.Update(tensorboard_->Eval(report));
    if (!tensorboard_status_.ok()) return tensorboard_status_;
  }
  return absl::OkStatus();
}

void Reporter::End(const v1::TrainingEnd& end) {
  Log("info", absl::StrCat(end.stop_reason().empty() ? "trained to step " : "",
                           end.stop_reason().empty() ? absl::StrCat(end.step()) : end.stop_reason(),
                           "; exporting step ", end.exported_step(), ", ", end.export_reason()));
  if (!writes_shared_files()) return;
  v1::TrainingEvent event;
  *event.mutable_end() = end;
  Send(std::move(event));
}

// A line for the rank log (stderr) and the job's event stream.
void Reporter::Log(const std::string& level, const std::string& text) {
  std::cerr << "ballast-train: " << text << std::endl;
  Send(LogEvent(level, text));
}

void Reporter::Straggler(const v1::StragglerReport& report) {
  std::cerr << "ballast-train: rank " << report.rank()
            << (report.straggling() ? " is a straggler" : " keeps up again") << " at step "
            << report.step() << ": its own step time " << report.step_time_s()
            << " s against the others' " << report.others_step_time_s() << " s" << std::endl;
  v1::TrainingEvent event;
  *event.mutable_straggler() = report;
  Send(event);
}

v1::GuardEvent DescribeAnomaly(const TensorNorms& norms, const StepHealth& health,
                               const GuardVerdict& verdict) {
  v1::GuardEvent anomaly;
  anomaly.set_kind(v1::GuardEvent::KIND_SKIP);
  anomaly.set_step(health.step);
  anomaly.set_trigger(TriggerName(verdict.trigger));
  anomaly.set_verdict(v1::GuardEvent::VERDICT_NOT_RERUN);
  anomaly.set_rank(health.nonfinite_rank);
  anomaly.set_module(health.first_nonfinite);
  if (health.supervised_tokens > 0) anomaly.set_loss(health.loss);
  anomaly.set_grad_norm(health.grad_norm);
  std::vector<size_t> order(norms.names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto key = [&](size_t i) {
    const double s = norms.sum_squares[i];
    return std::isfinite(s) ? s : std::numeric_limits<double>::infinity();
  };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(a) > key(b); });
  for (size_t k = 0; k < order.size() && k < 16; ++k) {
    v1::ModuleGradNorm* norm = anomaly.add_module_grad_norms();
    norm->set_module(norms.names[order[k]]);
    norm->set_grad_norm(std::sqrt(norms.sum_squares[order[k]]));
  }
  return anomaly;
}

void SetSkippedDocuments(int64_t first, const std::vector<int64_t>& lines, v1::GuardEvent* event) {
  event->set_first_document(first);
  event->set_documents_skipped(static_cast<int64_t>(lines.size()));
  event->clear_document_ids();
  for (size_t i = 0; i < lines.size() && i < 64; ++i) event->add_document_ids(lines[i]);
}

}  // namespace ballast::train
