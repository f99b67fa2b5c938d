#include "server/openai_api.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec_paths.h"
#include "common/model_config.h"
#include "common/multipart_form.h"
#include "server/http_api.h"
#include "server/openai_mapping.h"

namespace ballast::server {
namespace {

using nlohmann::json;

constexpr char kJson[] = "application/json";
// A create request is a few hundred bytes; a spec in its `ballast` object
// at most kMaxJobSpecBytes.
constexpr uint64_t kMaxCreateBytes = uint64_t{1} << 20;
// An upload's body holds its file and the form around it: its boundaries,
// part headers and the purpose.
constexpr uint64_t kFormBytes = 64 * 1024;
// Jobs read per ListJobs page while a list looks for `after`.
constexpr int32_t kListPage = 1000;
// The most events a job keeps (ballastd --event-retention's ceiling is the
// store's; this bounds one answer's work).
constexpr int64_t kMaxEventsRead = 100000;

void Answer(HttpResponse& response, const json& body) {
  response.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", kJson);
}

void Fail(HttpResponse& response, const absl::Status& status, absl::string_view param = "") {
  response.status = openai::ErrorStatus(status);
  response.set_content(openai::ErrorBody(status, param), kJson);
}

// `after` and `limit` of a list request; false (with a 400 written) when
// limit is not an integer in 1..kMaxPageSize.
bool PageParams(const HttpRequest& request, HttpResponse& response, std::string* after,
                int64_t* limit) {
  *after = request.get_param_value("after");
  *limit = openai::kDefaultPageSize;
  if (!request.has_param("limit")) return true;
  const std::string value = request.get_param_value("limit");
  if (!absl::SimpleAtoi(value, limit) || *limit < 1 || *limit > openai::kMaxPageSize) {
    Fail(response,
         absl::InvalidArgumentError(absl::StrCat(
             "limit=", value.substr(0, 32), " is not an integer in 1..", openai::kMaxPageSize)),
         "limit");
    return false;
  }
  return true;
}

void AnswerPage(HttpResponse& response, const std::vector<json>& items, const std::string& after,
                int64_t limit) {
  absl::StatusOr<json> page = openai::ListPage(items, after, limit);
  if (!page.ok()) return Fail(response, page.status(), "after");
  Answer(response, *page);
}

class OpenAiApi : public std::enable_shared_from_this<OpenAiApi> {
 public:
  OpenAiApi(Coordinator* coordinator, const Authenticator* auth, const UploadStore* uploads,
            OpenAiApiOptions options)
      : coordinator_(coordinator), auth_(auth), uploads_(uploads), options_(std::move(options)) {}

  void Add(HttpRoutes* server) {
    server->Post("/v1/files", options_.max_file_bytes + kFormBytes, Route(&OpenAiApi::UploadFile));
    server->Get("/v1/files/([^/]+)", Route(&OpenAiApi::GetFile));
    server->Post("/v1/fine_tuning/jobs", kMaxCreateBytes, Route(&OpenAiApi::CreateJob));
    server->Get("/v1/fine_tuning/jobs", Route(&OpenAiApi::ListJobs));
    server->Get("/v1/fine_tuning/jobs/([^/]+)", Route(&OpenAiApi::GetJob));
    server->Post("/v1/fine_tuning/jobs/([^/]+)/cancel", 0, Route(&OpenAiApi::CancelJob));
    server->Get("/v1/fine_tuning/jobs/([^/]+)/events", Route(&OpenAiApi::ListEvents));
    server->Get("/v1/fine_tuning/jobs/([^/]+)/checkpoints", Route(&OpenAiApi::ListCheckpoints));
    // What the server answers under /v1/ before any route runs (an unknown
    // path, a refused method, origin or body size) is OpenAI's error object.
    server->SetErrorFormat("/v1/", [](int http_status, absl::string_view message) {
      return openai::ErrorBodyOfHttpStatus(http_status, message);
    });
  }

 private:
  using Method = void (OpenAiApi::*)(const HttpRequest&, const Principal&, HttpResponse&);

  // The handler for `method`, behind the token check. The routes hold the
  // API for the server's life.
  HttpRoutes::Handler Route(Method method) {
    return [self = shared_from_this(), method](const HttpRequest& request, HttpResponse& response) {
      absl::StatusOr<Principal> who =
          JobReader(*self->auth_, request.get_header_value("Authorization"));
      if (!who.ok()) return Fail(response, who.status());
      (self.get()->*method)(request, *who, response);
    };
  }

  void UploadFile(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    absl::StatusOr<std::vector<FormPart>> parts =
        ParseMultipartForm(request.get_header_value("Content-Type"), request.body);
    if (!parts.ok()) return Fail(response, parts.status());
    const FormPart* file = nullptr;
    std::string purpose;
    for (const FormPart& part : *parts) {
      if (part.name == "file") file = &part;
      if (part.name == "purpose") purpose = std::string(part.data);
    }
    if (file == nullptr) {
      return Fail(response, absl::InvalidArgumentError("the form has no 'file' part"), "file");
    }
    if (file->data.size() > options_.max_file_bytes) {
      response.status = 413;
      response.set_content(
          openai::ErrorBodyOfHttpStatus(
              413,
              absl::StrCat("the file has ", file->data.size(), " bytes; this ballastd takes ",
                           options_.max_file_bytes, " at most (--openai-max-file-bytes)"),
              "file"),
          kJson);
      return;
    }
    std::string param;
    absl::StatusOr<UploadedFile> saved =
        uploads_->Save(who.tenant, file->filename, purpose, file->data, &param);
    if (!saved.ok()) return Fail(response, saved.status(), param);
    Answer(response, openai::FileObject(*saved));
  }

  void GetFile(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    absl::StatusOr<UploadedFile> file = uploads_->Find(who.tenant, request.matches[1]);
    if (!file.ok()) return Fail(response, file.status());
    Answer(response, openai::FileObject(*file));
  }

  // The folder and max_position_embeddings behind a request's `model`.
  absl::StatusOr<openai::ModelChoice> ModelOf(const std::string& model,
                                              const Principal& who) const {
    openai::ModelChoice choice;
    if (const auto it = options_.models.find(model); it != options_.models.end()) {
      choice.path = it->second;
    } else if (!model.empty() && model.front() == '/') {
      // A path is held to the rules of a spec's paths before anything in it
      // is read: the path roots, and no other tenant's job folder.
      v1::JobSpec probe;
      probe.mutable_model()->set_path(model);
      if (absl::Status s = CheckSpecPaths(probe, options_.path_roots); !s.ok()) return s;
      if (absl::Status s =
              CheckPathsOutsideOtherJobs(probe, options_.output_root,
                                         [&](const std::string& job_id) {
                                           return coordinator_->GetJob(job_id, who.tenant).ok();
                                         });
          !s.ok()) {
        return s;
      }
      choice.path = model;
    } else {
      std::vector<std::string> names;
      for (const auto& [name, path] : options_.models) names.push_back(name);
      return absl::InvalidArgumentError(
          absl::StrCat("model '", model.substr(0, 128), "' is neither a configured model (",
                       names.empty() ? "none configured" : absl::StrJoin(names, ", "),
                       ") nor an absolute path to a model folder"));
    }
    absl::StatusOr<ModelConfig> config = LoadModelConfig(choice.path);
    if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
    choice.max_position_embeddings = config->max_position_embeddings;
    return choice;
  }

  void CreateJob(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    const json body = json::parse(request.body, nullptr, /*allow_exceptions=*/false);
    if (!body.is_object()) {
      return Fail(response, absl::InvalidArgumentError("the body is not a JSON object"));
    }
    const json model = body.value("model", json());
    if (!model.is_string()) {
      return Fail(response, absl::InvalidArgumentError("model: a string is required"), "model");
    }
    const json training_file = body.value("training_file", json());
    if (!training_file.is_string()) {
      return Fail(response, absl::InvalidArgumentError("training_file: a file id is required"),
                  "training_file");
    }
    absl::StatusOr<UploadedFile> file = uploads_->Find(who.tenant, training_file);
    if (!file.ok()) return Fail(response, file.status(), "training_file");
    absl::StatusOr<openai::ModelChoice> choice = ModelOf(model, who);
    if (!choice.ok()) return Fail(response, choice.status(), "model");
    std::string param;
    absl::StatusOr<openai::CreatedJob> created =
        openai::SpecOfCreateRequest(body, *choice, *file, NewSeed(), &param);
    if (!created.ok()) return Fail(response, created.status(), param);
    // The client's Idempotency-Key (the openai package sends one per
    // request, the same on its retries) is the job's request_id: a retry
    // gets the job that the first try made.
    const std::string key = request.get_header_value("Idempotency-Key").substr(0, 128);
    absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(created->spec, key, who.tenant);
    if (!job.ok()) return Fail(response, job.status());
    if (absl::Status s =
            uploads_->SaveJobOrigin(who.tenant, job->id(), created->origin.ToJson().dump());
        !s.ok()) {
      return Fail(response, s);
    }
    Answer(response, openai::JobObject(*job, &created->origin));
  }

  // The job's object, with its origin when the API made it.
  json JobObjectOf(const v1::Job& job) const {
    std::optional<openai::JobOrigin> origin = OriginOf(job);
    return openai::JobObject(job, origin ? &*origin : nullptr);
  }

  std::optional<openai::JobOrigin> OriginOf(const v1::Job& job) const {
    absl::StatusOr<std::string> text = uploads_->LoadJobOrigin(job.tenant(), job.id());
    if (!text.ok()) return std::nullopt;
    absl::StatusOr<openai::JobOrigin> origin =
        openai::JobOrigin::FromJson(json::parse(*text, nullptr, false));
    if (!origin.ok()) return std::nullopt;
    return *origin;
  }

  void ListJobs(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    std::string after;
    int64_t limit = 0;
    if (!PageParams(request, response, &after, &limit)) return;
    // Newest first, as OpenAI lists them: pages of the coordinator's list
    // until the page after `after` is full (and one more, for has_more).
    std::vector<json> items;
    bool found = after.empty();
    int64_t wanted = limit + 1;
    v1::ListJobsRequest list;
    list.set_page_size(kListPage);
    do {
      absl::StatusOr<v1::ListJobsResponse> page = coordinator_->ListJobs(list, who.JobScope());
      if (!page.ok()) return Fail(response, page.status());
      for (const v1::Job& job : page->jobs()) {
        if (wanted == 0) break;
        if (found) --wanted;
        items.push_back(found ? JobObjectOf(job) : json{{"id", job.id()}});
        found |= job.id() == after;
      }
      list.set_page_token(page->next_page_token());
    } while (!list.page_token().empty() && wanted > 0);
    AnswerPage(response, items, after, limit);
  }

  void GetJob(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(request.matches[1], who.JobScope());
    if (!job.ok()) return Fail(response, job.status());
    Answer(response, JobObjectOf(*job));
  }

  void CancelJob(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    absl::StatusOr<v1::Job> job = coordinator_->CancelJob(request.matches[1], who.JobScope());
    if (!job.ok()) return Fail(response, job.status());
    Answer(response, JobObjectOf(*job));
  }

  // Every event the job keeps, oldest first.
  absl::StatusOr<std::vector<v1::JobEvent>> EventsOf(const std::string& job_id,
                                                     const Principal& who) {
    absl::StatusOr<std::unique_ptr<EventWatch>> watch =
        coordinator_->WatchJob(job_id, 0, who.JobScope());
    if (!watch.ok()) return watch.status();
    return EventsNow(**watch, kMaxEventsRead);
  }

  void ListEvents(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    std::string after;
    int64_t limit = 0;
    if (!PageParams(request, response, &after, &limit)) return;
    absl::StatusOr<std::vector<v1::JobEvent>> events = EventsOf(request.matches[1], who);
    if (!events.ok()) return Fail(response, events.status());
    std::vector<json> items;
    for (auto it = events->rbegin(); it != events->rend(); ++it) {
      items.push_back(openai::EventObject(*it));
    }
    AnswerPage(response, items, after, limit);
  }

  void ListCheckpoints(const HttpRequest& request, const Principal& who, HttpResponse& response) {
    std::string after;
    int64_t limit = 0;
    if (!PageParams(request, response, &after, &limit)) return;
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(request.matches[1], who.JobScope());
    if (!job.ok()) return Fail(response, job.status());
    absl::StatusOr<std::vector<v1::JobEvent>> events = EventsOf(job->id(), who);
    if (!events.ok()) return Fail(response, events.status());
    std::optional<openai::JobOrigin> origin = OriginOf(*job);
    AnswerPage(response, openai::Checkpoints(*job, origin ? &*origin : nullptr, *events), after,
               limit);
  }

  // OpenAI picks a seed when the request gives none, and reports it.
  static uint64_t NewSeed() {
    static thread_local std::mt19937_64 random{std::random_device{}()};
    return random() >> 33;
  }

  Coordinator* const coordinator_;
  const Authenticator* const auth_;
  const UploadStore* const uploads_;
  const OpenAiApiOptions options_;
};

}  // namespace

void AddOpenAiApi(HttpRoutes* server, Coordinator* coordinator, const Authenticator* auth,
                  const UploadStore* uploads, OpenAiApiOptions options) {
  std::make_shared<OpenAiApi>(coordinator, auth, uploads, std::move(options))->Add(server);
}

}  // namespace ballast::server
