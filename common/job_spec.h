// Job spec: the YAML a user writes, or the proto JSON a worker hands its
// ranks, as the ballast.v1.JobSpec proto, and its validation. YAML keys
// mirror the proto's field names (snake_case); see README.
//
// Every error is INVALID_ARGUMENT and names the field by its dotted path
// (e.g. "lora.r") with the allowed range, so a bad spec fails before any
// compute and a user knows what to change.
#ifndef BALLAST_COMMON_JOB_SPEC_H_
#define BALLAST_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

// The largest spec the service takes, in bytes (a real one is a few KiB):
// LoadJobSpecFile refuses a longer file before it parses it, and
// ValidateJobSpec a spec whose proto is longer, so that neither the CLI nor
// ballastd spends memory and time on a wrong file.
inline constexpr int64_t kMaxJobSpecBytes = int64_t{1} << 20;

// Parses YAML text into a JobSpec. Unknown keys, wrong types and malformed
// YAML are errors; absent keys stay unset (see ApplyDefaults).
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(const std::string& yaml_text);

// Parses the proto JSON form of a JobSpec (protobuf's JSON parser: field
// names in snake_case or lowerCamelCase, int64 as numbers or strings).
// Unknown fields and malformed JSON are INVALID_ARGUMENT.
absl::StatusOr<v1::JobSpec> ParseJobSpecJson(const std::string& json_text);

// Reads and parses a spec file: proto JSON (ParseJobSpecJson) when the name
// ends in ".json", YAML (ParseJobSpecYaml) otherwise. Errors are prefixed
// with the path; NOT_FOUND names the path when it is missing;
// INVALID_ARGUMENT for a file past kMaxJobSpecBytes or not a regular file.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Applies `key=value` overrides (dotted paths, YAML values), as in
// `ballast submit FILE --set optimizer.lr=1e-4`.
absl::Status ApplyOverrides(const std::vector<std::string>& overrides, v1::JobSpec* spec);

// Fills every unset field with its default (common/spec_rules.h); the
// defaults of a task's own section only for that task.
void ApplyDefaults(v1::JobSpec* spec);

// Checks every field against its range or choices (common/spec_rules.h),
// and the rules between fields. Call after ApplyDefaults.
// Checks that need the model (model_type, seq_len against
// max_position_embeddings) or the data file are ValidateJobSpecFiles', and
// PrepareJobSpec runs both (common/job_spec_files.h).
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

}  // namespace ballast

#endif  // BALLAST_COMMON_JOB_SPEC_H_
