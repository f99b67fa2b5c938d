// WriteDataCheck: what the trainer would train on, for a user to read
// before a job runs (`ballast-train data-check`). It runs the job's data
// pipeline (training_data.h) without a model's weights, and writes the
// report, the first bad records, then the first rows decoded with the
// trained tokens marked.
#ifndef BALLAST_WORKER_TRAIN_DATA_DATA_CHECK_H_
#define BALLAST_WORKER_TRAIN_DATA_DATA_CHECK_H_

#include <cstdint>
#include <ostream>

#include "absl/status/status.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast::train {

// The marks around the tokens whose label is trained.
inline constexpr char kTrainedOpen[] = "\u27e6";   // ⟦
inline constexpr char kTrainedClose[] = "\u27e7";  // ⟧

// `spec` is a prepared job spec (PrepareJobSpec). Shows `rows` rows of the
// first epoch. Errors as OpenTrainingData's.
absl::Status WriteDataCheck(const v1::JobSpec& spec, int64_t rows, std::ostream& out);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_DATA_CHECK_H_
