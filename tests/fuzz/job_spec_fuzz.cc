// Fuzzes the job spec as a submission meets it: the YAML parser, --set
// overrides, the defaults and range checks, and the checks against the
// model's config.json (common/job_spec.h, common/job_spec_files.h).
//
// Input: the spec's YAML, then optionally a NUL and the text of the
// config.json, then optionally a NUL and --set overrides, one a line. The
// spec's paths are pointed into a private folder holding that config.json,
// so no input reads anything else on the machine.
//
// Invariants beyond not crashing: every error is INVALID_ARGUMENT (the
// code the coordinator returns for a bad spec), and a spec that passes
// survives its proto JSON form unchanged (ParseJobSpecJson reads what the
// worker hands its ranks).
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <stdlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/job_spec_files.h"
#include "tests/fuzz/invariant.h"

namespace {

using ballast::fuzz::Require;

// A folder of this process's own, removed at exit.
const std::string& ModelFolder() {
  static const std::string* folder = [] {
    std::string pattern = std::filesystem::temp_directory_path() / "job_spec_fuzz.XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ModelFolder(), ignored);
    });
    return new std::string(pattern);
  }();
  return *folder;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = absl::StrSplit(
      absl::string_view(reinterpret_cast<const char*>(data), size), absl::MaxSplits('\0', 2));
  absl::StatusOr<ballast::v1::JobSpec> spec = ballast::ParseJobSpecYaml(parts[0]);
  if (!spec.ok()) {
    Require(absl::IsInvalidArgument(spec.status()), "ParseJobSpecYaml error code", spec.status());
    return 0;
  }
  if (parts.size() > 2) {
    const std::vector<std::string> overrides = absl::StrSplit(parts[2], '\n');
    const absl::Status status = ballast::ApplyOverrides(overrides, &*spec);
    Require(status.ok() || absl::IsInvalidArgument(status), "ApplyOverrides error code", status);
    if (!status.ok()) return 0;
  }

  const std::string config_json = (std::filesystem::path(ModelFolder()) / "config.json").string();
  {
    std::ofstream out(config_json, std::ios::trunc);
    if (parts.size() > 1) out << parts[1];
  }
  spec->mutable_model()->set_path(ModelFolder());
  spec->mutable_data()->set_path(config_json);
  spec->mutable_data()->clear_tokenizer();
  if (spec->has_reranker() && !spec->reranker().eval_path().empty()) {
    spec->mutable_reranker()->set_eval_path(config_json);
  }
  const absl::Status status = ballast::PrepareJobSpec(&*spec);
  Require(status.ok() || absl::IsInvalidArgument(status), "PrepareJobSpec error code", status);
  if (!status.ok()) return 0;

  std::string json;
  Require(google::protobuf::util::MessageToJsonString(*spec, &json).ok(), "spec prints as JSON");
  absl::StatusOr<ballast::v1::JobSpec> reparsed = ballast::ParseJobSpecJson(json);
  Require(reparsed.ok(), "a valid spec's JSON parses", reparsed.status());
  Require(google::protobuf::util::MessageDifferencer::Equals(*spec, *reparsed),
          "a valid spec survives its JSON form");
  return 0;
}
