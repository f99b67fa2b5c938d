#include "worker/train/trainer/metrics_log.h"

#include <google/protobuf/descriptor.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/proto_json.h"

namespace ballast::train {
namespace {

namespace pb = google::protobuf;

// The file's forms (see metrics_log.h) for every int64 and double field of
// `m`, found by its descriptor, and of the messages it holds (the moe
// section), into `json`, the mapping's object of `m`.
void ApplyFileForms(const pb::Message& m, nlohmann::json& json) {
  const pb::Descriptor* descriptor = m.GetDescriptor();
  const pb::Reflection* reflection = m.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const pb::FieldDescriptor* field = descriptor->field(i);
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (!json.contains(field->name())) continue;
      nlohmann::json& held = json[field->name()];
      if (!field->is_repeated()) {
        ApplyFileForms(reflection->GetMessage(m, field), held);
        continue;
      }
      for (int k = 0; k < reflection->FieldSize(m, field); ++k) {
        ApplyFileForms(reflection->GetRepeatedMessage(m, field, k), held[k]);
      }
    } else if (field->is_repeated()) {
      continue;
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      json[field->name()] = reflection->GetInt64(m, field);
    } else if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE) {
      const double value = reflection->GetDouble(m, field);
      const bool present = !field->has_presence() || reflection->HasField(m, field);
      json[field->name()] =
          present && std::isfinite(value) ? nlohmann::json(value) : nlohmann::json();
    }
  }
}

// The mapping's line, then the file's forms.
nlohmann::json MetricsLine(const pb::Message& m) {
  nlohmann::json line = nlohmann::json::parse(ToJson(m));
  ApplyFileForms(m, line);
  return line;
}

}  // namespace

absl::StatusOr<MetricsLog> MetricsLog::Open(const std::string& path, int64_t step) {
  MetricsLog log(path);
  if (absl::Status s = log.TruncateAfter(step); !s.ok()) return s;
  return log;
}

absl::Status MetricsLog::Append(const v1::StepMetrics& metrics, absl::string_view skip_reason) {
  nlohmann::json line = MetricsLine(metrics);
  if (!skip_reason.empty()) line["skip_reason"] = std::string(skip_reason);
  return Write(line);
}

absl::Status MetricsLog::AppendEval(const v1::EvalReport& report) {
  return Write(nlohmann::json{{"step", report.step()}, {"eval", MetricsLine(report)}});
}

absl::Status MetricsLog::Write(const nlohmann::json& line) {
  errno = 0;
  out_ << line.dump() << "\n";
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
