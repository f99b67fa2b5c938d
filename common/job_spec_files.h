// Checks of a job spec against the files it names: the model folder's
// config.json and the data file. ValidateJobSpec (job_spec.h) checks ranges
// alone; this one reads the disk, so the coordinator runs it at submission
// and a spec that cannot run fails before it is queued.
#ifndef BALLAST_COMMON_JOB_SPEC_FILES_H_
#define BALLAST_COMMON_JOB_SPEC_FILES_H_

#include "absl/status/status.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

// OK when model.path/config.json exists and parses as a JSON object,
// data.path is an existing regular file, and data.seq_len is at most the
// model's max_position_embeddings (when config.json states one). Otherwise
// INVALID_ARGUMENT naming the field, the path, and the allowed range.
// Reads only config.json; thread-safe.
absl::Status ValidateJobSpecFiles(const v1::JobSpec& spec);

}  // namespace ballast

#endif  // BALLAST_COMMON_JOB_SPEC_FILES_H_
