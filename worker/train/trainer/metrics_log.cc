#include "worker/train/trainer/metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

nlohmann::json ToJson(const StepRecord& r) {
  nlohmann::json j = {
      {"step", r.step},
      {"loss", r.loss && std::isfinite(*r.loss) ? nlohmann::json(*r.loss) : nlohmann::json()},
      {"grad_norm", std::isfinite(r.grad_norm) ? nlohmann::json(r.grad_norm) : nlohmann::json()},
      {"lr", r.lr},
      {"tokens", r.tokens},
      {"supervised_tokens", r.supervised_tokens},
      {"step_time_s", r.step_time_s},
      {"peak_memory_bytes", r.peak_memory_bytes},
      {"skipped", r.skipped}};
  if (!r.skip_reason.empty()) j["skip_reason"] = r.skip_reason;
  return j;
}

}  // namespace

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& path, int64_t step) {
  MetricsLog log(path);
  if (absl::Status s = log.TruncateAfter(step); !s.ok()) return s;
  return log;
}

absl::Status MetricsLog::Append(const StepRecord& record) {
  errno = 0;
  out_ << ToJson(record).dump() << "\n";
  out_.flush();
  if (out_) return absl::OkStatus();
  // The stream keeps no reason; errno has the one a user acts on (ENOSPC).
  const int err = errno;
  return absl::InternalError(
      absl::StrCat("cannot append to ", path_, err != 0 ? absl::StrCat(": ", strerror(err)) : ""));
}

absl::Status MetricsLog::TruncateAfter(int64_t step) {
  out_.close();
  std::string kept, line;
  {
    std::ifstream in(path_);
    while (in && std::getline(in, line)) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      // A torn last line (a crash mid-write) ends the log like a later step.
      if (j.is_discarded() || !j.contains("step") || j["step"].get<int64_t>() > step) break;
      kept += line + "\n";
    }
  }
  // A new file renamed over the old: a crash leaves one or the other whole,
  // and a reader that follows the file by offset (rank/attempt_output.h)
  // sees a new inode, not a shorter file that grows again.
  const std::string tmp = path_ + ".tmp";
  std::ofstream rewrite(tmp, std::ios::trunc);
  rewrite << kept;
  rewrite.close();
  if (!rewrite || std::rename(tmp.c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rewrite ", path_));
  }
  out_.open(path_, std::ios::app);
  if (!out_) return absl::InternalError(absl::StrCat("cannot open ", path_, " for appending"));
  return absl::OkStatus();
}

}  // namespace ballast::train
