// Job spec: the YAML a user writes, as the ballast.v1.JobSpec proto, and its
// validation. Keys mirror the proto's field names (snake_case); see README.
//
// Every error is INVALID_ARGUMENT and names the field by its dotted path
// (e.g. "lora.r") with the allowed range, so a bad spec fails before any
// compute and a user knows what to change.
#ifndef BALLAST_COMMON_JOB_SPEC_H_
#define BALLAST_COMMON_JOB_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

// Parses YAML text into a JobSpec. Unknown keys, wrong types and malformed
// YAML are errors; absent keys keep their proto defaults (see ApplyDefaults).
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(const std::string& yaml_text);

// Reads and parses a spec file. NOT_FOUND names the path when it is missing.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Applies `key=value` overrides (dotted paths, YAML values), as in
// `ballast submit FILE --set optimizer.lr=1e-4`.
absl::Status ApplyOverrides(const std::vector<std::string>& overrides, v1::JobSpec* spec);

// Fills every unset field with its documented default (proto comments).
void ApplyDefaults(v1::JobSpec* spec);

// Checks every field against its documented range. Call after ApplyDefaults.
// Checks that need the model (seq_len against max_position_embeddings, the
// model folder's contents) are the trainer's.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

}  // namespace ballast

#endif  // BALLAST_COMMON_JOB_SPEC_H_
