#include "worker/train/trainer/tensorboard_log.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tensorboard/event.pb.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// What TensorBoard's readers check the first record for; version 2 is the
// one whose restarts are marked by session starts.
constexpr char kFileVersion[] = "brain.Event:2";

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

void AddScalar(absl::string_view tag, double value, tensorboard::Summary* summary) {
  tensorboard::Summary::Value* v = summary->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
}

tensorboard::Event SessionStart(int64_t step) {
  tensorboard::Event event;
  event.set_step(step + 1);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  return event;
}

}  // namespace

std::string TensorBoardLog::FileName(int64_t unix_seconds, absl::string_view hostname,
                                     int64_t pid) {
  return absl::StrFormat("events.out.tfevents.%010d.%s.%d", unix_seconds, hostname, pid);
}

absl::StatusOr<TensorBoardLog> TensorBoardLog::Open(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const std::string path =
      (fs::path(dir) / FileName(absl::ToUnixSeconds(absl::Now()), HostName(), getpid())).string();
  absl::StatusOr<RecordFile> file = RecordFile::Open(path);
  if (!file.ok()) return file.status();
  TensorBoardLog log(*std::move(file));
  tensorboard::Event version;
  version.set_file_version(kFileVersion);
  if (absl::Status s = log.Write(version); !s.ok()) return s;
  if (absl::Status s = log.RestartAfter(step); !s.ok()) return s;
  return log;
}

absl::Status TensorBoardLog::Step(const v1::StepMetrics& m) {
  tensorboard::Event event;
  event.set_step(m.step());
  tensorboard::Summary* summary = event.mutable_summary();
  // metrics.jsonl's nulls (metrics_log.h) are left out, not drawn as NaN.
  if (m.has_loss() && std::isfinite(m.loss())) AddScalar("train/loss", m.loss(), summary);
  if (std::isfinite(m.grad_norm())) AddScalar("train/grad_norm", m.grad_norm(), summary);
  AddScalar("train/lr", m.lr(), summary);
  AddScalar("train/tokens_per_s", m.tokens_per_s(), summary);
  return Write(event);
}

absl::Status TensorBoardLog::Eval(const v1::EvalReport& report) {
  tensorboard::Event event;
  event.set_step(report.step());
  tensorboard::Summary* summary = event.mutable_summary();
  if (report.groups() > 0) {
    AddScalar("eval/mrr_at_10", report.mrr_at_10(), summary);
    AddScalar("eval/ndcg_at_10", report.ndcg_at_10(), summary);
  } else if (report.has_loss() && std::isfinite(report.loss())) {
    AddScalar("eval/loss", report.loss(), summary);
  }
  return Write(event);
}

absl::Status TensorBoardLog::Text(absl::string_view tag, int64_t step, absl::string_view text) {
  tensorboard::Event event;
  event.set_step(step);
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  // The text plugin's metadata: its name, an empty TextPluginData (version
  // 0, as its summary op writes it), and the data class TensorBoard's
  // readers give a text summary of one string.
  v->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  v->mutable_metadata()->set_data_class(tensorboard::DATA_CLASS_TENSOR);
  tensorboard::TensorProto* tensor = v->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape();  // no dims: one string
  tensor->add_string_val(std::string(text));
  return Write(event);
}

absl::Status TensorBoardLog::RestartAfter(int64_t step) {
  tensorboard::Event start = SessionStart(step);
  return Write(start);
}

absl::Status TensorBoardLog::Write(tensorboard::Event& event) {
  event.set_wall_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return file_.Append(event.SerializeAsString());
}

}  // namespace ballast::train
