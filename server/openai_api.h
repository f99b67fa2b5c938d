// The OpenAI-compatible fine-tuning API on ballastd's --http address
// (docs/openai-api.md), a thin mapping onto the same Coordinator calls the
// gRPC JobService makes, with the same tokens and tenant rules, so that it
// is no second control plane:
//   POST /v1/files                         upload a chat JSONL (purpose fine-tune)
//   GET  /v1/files/ID
//   POST /v1/fine_tuning/jobs              SubmitJob
//   GET  /v1/fine_tuning/jobs[?after=&limit=]   ListJobs
//   GET  /v1/fine_tuning/jobs/ID           GetJob
//   POST /v1/fine_tuning/jobs/ID/cancel    CancelJob
//   GET  /v1/fine_tuning/jobs/ID/events[?after=&limit=]       newest first
//   GET  /v1/fine_tuning/jobs/ID/checkpoints[?after=&limit=]  newest first
// Its objects and parameters are server/openai_mapping.h's. Every answer is
// JSON; errors are OpenAI's error object. The two POSTs are the HTTP
// endpoint's one exception to GET-only, behind its check that a
// state-changing request carries a bearer token and no foreign Origin
// (common/http_security.h).
#ifndef BALLAST_SERVER_OPENAI_API_H_
#define BALLAST_SERVER_OPENAI_API_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/http_routes.h"
#include "server/authenticator.h"
#include "server/coordinator.h"
#include "server/upload_store.h"

namespace ballast::server {

struct OpenAiApiOptions {
  // The names a create request's `model` may give, and their folders
  // (ballastd --openai-model NAME=PATH). Any other model is an absolute
  // path, under the path roots when ballastd has them.
  std::map<std::string, std::string> models;
  // The largest upload, in bytes (--openai-max-file-bytes).
  uint64_t max_file_bytes = kDefaultMaxUploadBytes;
  // ballastd's, for the model path checks.
  std::string output_root;
  std::vector<std::string> path_roots;
};

// Adds the routes above. `coordinator`, `auth` and `uploads` must outlive
// the server.
void AddOpenAiApi(HttpRoutes* server, Coordinator* coordinator, const Authenticator* auth,
                  const UploadStore* uploads, OpenAiApiOptions options);

}  // namespace ballast::server

#endif  // BALLAST_SERVER_OPENAI_API_H_
