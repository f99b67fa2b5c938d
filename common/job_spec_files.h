// Checks of a job spec against the files it names: the model folder's
// config.json and the data file. ValidateJobSpec (job_spec.h) checks ranges
// alone; these read the disk. The coordinator runs PrepareJobSpec at
// submission and ballast-train runs it before it creates the trainer, so a
// spec that cannot run fails before it is queued or loads any weights, and
// both refuse it with the same message.
#ifndef BALLAST_COMMON_JOB_SPEC_FILES_H_
#define BALLAST_COMMON_JOB_SPEC_FILES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

// OK when every path is absolute and under `roots` (CheckSpecPaths in
// common/job_spec_paths.h; no roots: anywhere), model.path/config.json
// exists and parses as a JSON object, its model_type is supported
// (common/model_types.h), it states a positive integer
// max_position_embeddings, data.seq_len is at most that, a moe section is
// set only for a model with experts (num_experts), the model folder's
// *.safetensors and *.json are regular files, lora.init_adapter (when set)
// is a PEFT adapter folder, and data.path is an existing regular file.
// Otherwise INVALID_ARGUMENT naming the field, the path, and the allowed
// values or range. Reads only config.json (at most kMaxConfigJsonBytes),
// adapter_config.json and the other files' metadata; thread-safe.
absl::Status ValidateJobSpecFiles(const v1::JobSpec& spec,
                                  const std::vector<std::string>& roots = {});

// Every rule a spec must pass before it runs, in order: ApplyDefaults, then
// ValidateJobSpec (ranges), then ValidateJobSpecFiles. Returns the first
// failure, as those do; fills `spec`'s defaults on success and failure alike.
// Before the defaults it reads config.json, when it can: a model with
// experts gets a moe section (so its keys are defaulted), and a moe section
// for a dense model is refused then, naming the keys the user set.
absl::Status PrepareJobSpec(v1::JobSpec* spec, const std::vector<std::string>& roots = {});

}  // namespace ballast

#endif  // BALLAST_COMMON_JOB_SPEC_FILES_H_
