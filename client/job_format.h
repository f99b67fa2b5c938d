// How jobs, workers and events read on the terminal (tables, one-line event
// descriptions) and in JSON (protobuf's JSON mapping, one document per line).
#ifndef BALLAST_CLIENT_JOB_FORMAT_H_
#define BALLAST_CLIENT_JOB_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_service.pb.h"
#include "ballast/v1/token_service.pb.h"
#include "common/printable.h"
#include "common/proto_json.h"

namespace ballast::client {

// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(v1::JobState state);

// Parses "running", "RUNNING" or "JOB_STATE_RUNNING". INVALID_ARGUMENT lists
// the accepted names.
absl::StatusOr<v1::JobState> ParseState(const std::string& text);

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsTerminal(v1::JobState state);

// Left-aligned columns two spaces apart, header first, one line per row;
// every cell through Printable (common/printable.h).
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

// `list`: ID STATE NAME STEP LOSS AGE. STEP is "step/max_steps"; LOSS is the
// last step's, "-" before the first step and for a step without a loss; AGE
// counts from created_ms to now_ms.
std::string JobTable(const std::vector<v1::Job>& jobs, int64_t now_ms);

// `workers`: ID HOST KIND BUSY/CAP ALIVE LAST HEARTBEAT ("4s ago").
std::string WorkerTable(const std::vector<v1::Worker>& workers, int64_t now_ms);

// "worker" for ROLE_WORKER.
std::string RoleName(v1::Role role);

// `token list`: ID ROLE TENANT/WORKER CREATED REVOKED DESCRIPTION.
std::string TokenTable(const std::vector<v1::Token>& tokens, int64_t now_ms);

// `get`: one "KEY  value" line per known fact about the job.
std::string JobDetail(const v1::Job& job, int64_t now_ms);

// "[rank 0] text" for info, "[rank 0] warning: text" otherwise.
std::string LogLineText(const v1::LogLine& log);

// One line for a DataReport: the format, the counts, the packing, and what
// was lost to bad records and truncation.
std::string DataLine(const v1::DataReport& d);

// One line for an EvalReport: the step, the loss or MRR@10 and NDCG@10,
// what it was measured over, and whether it is the best so far.
std::string EvalLine(const v1::EvalReport& e);

// One line for a TrainingEnd: why training ended and which step's weights
// were exported, and why: "stopped early at step 12: eval_loss did not
// improve by 0 for 3 evaluations since step 6; exported step 6 (the best
// eval_loss, 1.234 at step 6)".
std::string EndLine(const v1::TrainingEnd& end);

// "guard rollback at step 7 to step 4 [non_finite, deterministic, lora_B on
// rank 1, 3 steps lost, 24 documents skipped from position 32]: message".
std::string GuardLine(const v1::GuardEvent& event);

// The line `watch` prints for an event on its own: state changes, guard
// events, checkpoints, and warning/error log lines. nullopt for step metrics
// and info log lines.
std::optional<std::string> EventLine(const v1::JobEvent& event);

// "job-… SUCCEEDED", or "job-… FAILED: reason" when the job has a failure reason.
std::string FinalLine(const v1::Job& job);

}  // namespace ballast::client

#endif  // BALLAST_CLIENT_JOB_FORMAT_H_
