// Text for the `watch` progress line: durations, ETA, thousands separators,
// the grad_norm sparkline, and the step line itself. Pure functions.
#ifndef BALLAST_CLIENT_PROGRESS_H_
#define BALLAST_CLIENT_PROGRESS_H_

#include <cstdint>
#include <span>
#include <string>

#include "ballast/v1/job.pb.h"

namespace ballast::client {

// Whole seconds, two units at most: "45s", "1m32s", "2h05m", "3d04h".
// Negative or non-finite input gives "-".
std::string FormatDuration(double seconds);

// Time left for the steps after `step`: (max_steps - step) * step_time_s,
// as FormatDuration. "-" when the step time is unknown (<= 0 or non-finite).
std::string FormatEta(int64_t step, int64_t max_steps, double step_time_s);

// Rounds to an integer and groups digits by three: 1949.6 gives "1,950".
std::string FormatThousands(double value);

// One character per value, scaled from the smallest to the largest finite
// value onto ▁▂▃▄▅▆▇█. A non-finite value is "!"; when all finite values are
// equal they are all ▄.
std::string Sparkline(std::span<const double> values);

// The first `columns` characters (UTF-8 code points) of `line`; all of it
// when columns <= 0. Keeps a redrawn line from wrapping, which \r cannot undo.
std::string FitColumns(const std::string& line, int columns);

// The step's loss to four decimals, "2.3412"; "-" when the step has none (no
// supervised token), and for a Job's absent last_step.
std::string FormatLoss(const v1::StepMetrics& m);

// "step 12/200 loss 2.3412 grad_norm 0.812 lr 1.0e-04 tok/s 1,950 ETA 1m32s",
// then " skipped" when the guard kept the step from the weights, then a space
// and `sparkline` when it is not empty. The loss is FormatLoss.
// `mean_step_time_s` drives the ETA.
std::string ProgressLine(const v1::StepMetrics& m, double mean_step_time_s,
                         const std::string& sparkline);

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_PROGRESS_H_
