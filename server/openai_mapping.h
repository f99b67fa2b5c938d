// The OpenAI fine-tuning API's objects and parameters in Ballast's terms
// (docs/openai-api.md), apart from the routes (server/openai_api.h) so that
// each rule is tested alone: job states, a job, its events and checkpoints,
// list pages, error objects, and a create request into a JobSpec with the
// documented defaults for "auto". The objects are the fields the `openai`
// Python client reads (openai/types/fine_tuning/, types/file_object.py).
#ifndef BALLAST_SERVER_OPENAI_MAPPING_H_
#define BALLAST_SERVER_OPENAI_MAPPING_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job.pb.h"
#include "ballast/v1/job_spec.pb.h"
#include "server/upload_store.h"

namespace ballast::server::openai {

// The defaults for a hyperparameter left out or "auto".
inline constexpr int64_t kAutoEpochs = 3;
// Chats per optimizer step, at most the file's.
inline constexpr int64_t kAutoBatchSize = 8;
// learning_rate_multiplier x this is optimizer.lr: LoRA's usual base, and a
// full finetune's.
inline constexpr double kBaseLearningRateLora = 1e-4;
inline constexpr double kBaseLearningRateFull = 1e-5;
// data.seq_len: the model's max_position_embeddings, at most this.
inline constexpr int64_t kMaxAutoSeqLen = 4096;
// List pages: `limit`'s default and its largest value.
inline constexpr int64_t kDefaultPageSize = 20;
inline constexpr int64_t kMaxPageSize = 100;

// Job state -> status: QUEUED is "queued"; SCHEDULED (ranks starting: they
// load the model and read the data) "validating_files"; RUNNING and
// ROLLING_BACK "running"; CANCELLING and CANCELLED "cancelled" (OpenAI's
// cancel answers "cancelled" at once); SUCCEEDED and FAILED as named.
const char* JobStatus(v1::JobState state);

// What a job was created with that its JobSpec does not say; kept beside it
// by the API (server/openai_api.cc), absent for a job submitted over gRPC.
struct JobOrigin {
  std::string model;
  std::string training_file;
  int64_t n_epochs = 0;
  int64_t batch_size = 0;
  double learning_rate_multiplier = 0;
  std::string suffix;

  nlohmann::json ToJson() const;
  // INVALID_ARGUMENT for a damaged record.
  static absl::StatusOr<JobOrigin> FromJson(const nlohmann::json& json);
};

// The model name a finished job gives: ft:MODEL:TENANT:SUFFIX:JOB_ID, as
// OpenAI's ft:BASE:ORG:SUFFIX:ID.
std::string FineTunedModel(const v1::Job& job, const JobOrigin* origin);

// A `fine_tuning.job`. Without an origin (a gRPC job) the model and
// training_file are the spec's paths and the hyperparameters what the spec
// says (n_epochs and the multiplier null).
nlohmann::json JobObject(const v1::Job& job, const JobOrigin* origin);

// A `fine_tuning.job.event`, id "ftevent-JOB_ID-SEQ": state changes, log
// lines, guard decisions and data reports as messages, steps and
// evaluations as metrics.
nlohmann::json EventObject(const v1::JobEvent& event);
// The seq of an event id of `job_id`, or -1.
int64_t EventSeqOfId(absl::string_view id, const std::string& job_id);

// The job's `fine_tuning.job.checkpoint`s, newest first, from its
// CheckpointSaved events (the newest per step), with the train loss of that
// step's StepMetrics when seen.
std::vector<nlohmann::json> Checkpoints(const v1::Job& job, const JobOrigin* origin,
                                        const std::vector<v1::JobEvent>& events);

// A `file` object.
nlohmann::json FileObject(const UploadedFile& file);

// {"object": "list", "data": ..., "has_more": ...}: the items (each with an
// "id") after the one whose id is `after` (from the first when empty), at
// most `limit`. INVALID_ARGUMENT when `after` is no item's id.
absl::StatusOr<nlohmann::json> ListPage(const std::vector<nlohmann::json>& items,
                                        const std::string& after, int64_t limit);

// An error's HTTP status and body, {"error": {"message", "type", "param",
// "code"}}: 400 invalid_request_error for INVALID_ARGUMENT,
// FAILED_PRECONDITION and OUT_OF_RANGE; 401 (code invalid_api_key); 403; 404
// (another tenant's job or file too); 429 for RESOURCE_EXHAUSTED (a quota;
// code insufficient_quota); 503 UNAVAILABLE; 500 server_error otherwise.
// `param` is the request field at fault, empty for none (null).
int ErrorStatus(const absl::Status& status);
std::string ErrorBody(const absl::Status& status, absl::string_view param = "");

// The same object for an HTTP status that no absl::Status stands for, as
// the HTTP server answers before any route runs under /v1/
// (HttpRoutes::SetErrorFormat): a refused origin or token header (403, code
// permission_denied), a method no route takes (405, method_not_allowed), a
// body over its limit (413, request_too_large; also a route's own), a path
// no route takes (404, not_found).
std::string ErrorBodyOfHttpStatus(int http_status, absl::string_view message,
                                  absl::string_view param = "");

// What a create request becomes.
struct CreatedJob {
  v1::JobSpec spec;
  JobOrigin origin;
};

// The model folder behind a create request's `model`, and its
// max_position_embeddings; the API finds them (server/openai_api.cc).
struct ModelChoice {
  std::string path;
  int64_t max_position_embeddings = 0;
};

// A create request's body into a JobSpec, for `file` (its training_file):
// the model, the hyperparameters ("auto" or left out: the defaults above),
// method.type supervised, suffix and seed, then the `ballast` object (a
// JobSpec in proto JSON) merged over it, so that any field can be set.
// INVALID_ARGUMENT with *param the field at fault.
absl::StatusOr<CreatedJob> SpecOfCreateRequest(const nlohmann::json& request,
                                               const ModelChoice& model, const UploadedFile& file,
                                               uint64_t random_seed, std::string* param);

}  // namespace ballast::server::openai

#endif  // BALLAST_SERVER_OPENAI_MAPPING_H_
