#include "server/openai_mapping.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/http_security.h"
#include "common/job_spec.h"

namespace ballast::server::openai {
namespace {

using nlohmann::json;

constexpr int64_t kMaxEpochs = 50;
constexpr int64_t kMaxBatchSize = 256;
constexpr double kMaxMultiplier = 10;
constexpr size_t kMaxSuffix = 64;

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

json OrNull(const std::string& text) { return text.empty() ? json() : json(text); }

// A hyperparameter: absent, null or "auto" leave *out alone; otherwise a
// number in [low, high] (an integer when `integer`). INVALID_ARGUMENT naming
// `name` else.
absl::Status Hyperparameter(const json& parent, const char* name, double low, double high,
                            bool integer, double* out) {
  const auto it = parent.find(name);
  if (it == parent.end() || it->is_null() || (it->is_string() && *it == "auto")) {
    return absl::OkStatus();
  }
  const bool fits = it->is_number() && (!integer || it->is_number_integer()) &&
                    it->get<double>() >= low && it->get<double>() <= high &&
                    (integer || it->get<double>() > 0);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": ", it->dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 64),
        " is not \"auto\" or ", integer ? "an integer" : "a number", " in ", integer ? "" : "(",
        integer ? absl::StrCat(low) : "0", "..", high, integer ? "" : "]"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return absl::AsciiStrToLower(name.substr(sizeof("JOB_STATE_") - 1));
}

}  // namespace

const char* JobStatus(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SCHEDULED:
      return "validating_files";
    case v1::JOB_STATE_RUNNING:
    case v1::JOB_STATE_ROLLING_BACK:
      return "running";
    case v1::JOB_STATE_SUCCEEDED:
      return "succeeded";
    case v1::JOB_STATE_FAILED:
      return "failed";
    case v1::JOB_STATE_CANCELLING:
    case v1::JOB_STATE_CANCELLED:
      return "cancelled";
    default:
      return "queued";
  }
}

json JobOrigin::ToJson() const {
  return {{"model", model},
          {"training_file", training_file},
          {"n_epochs", n_epochs},
          {"batch_size", batch_size},
          {"learning_rate_multiplier", learning_rate_multiplier},
          {"suffix", suffix}};
}

absl::StatusOr<JobOrigin> JobOrigin::FromJson(const json& record) {
  JobOrigin origin;
  try {
    origin.model = record.at("model").get<std::string>();
    origin.training_file = record.at("training_file").get<std::string>();
    origin.n_epochs = record.at("n_epochs").get<int64_t>();
    origin.batch_size = record.at("batch_size").get<int64_t>();
    origin.learning_rate_multiplier = record.at("learning_rate_multiplier").get<double>();
    origin.suffix = record.at("suffix").get<std::string>();
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("a job's OpenAI record: ", e.what()));
  }
  return origin;
}

std::string FineTunedModel(const v1::Job& job, const JobOrigin* origin) {
  return absl::StrCat("ft:", origin != nullptr ? origin->model : job.spec().model().path(), ":",
                      job.tenant(), ":", origin != nullptr ? origin->suffix : job.spec().name(),
                      ":", job.id());
}

json JobObject(const v1::Job& job, const JobOrigin* origin) {
  const v1::JobSpec& spec = job.spec();
  const int64_t batch = int64_t{spec.data().micro_batch_size()} * spec.data().grad_accum_steps() *
                        std::max(1, spec.devices());
  json hyperparameters = {{"n_epochs", origin != nullptr ? json(origin->n_epochs) : json()},
                          {"batch_size", origin != nullptr ? origin->batch_size : batch},
                          {"learning_rate_multiplier",
                           origin != nullptr ? json(origin->learning_rate_multiplier) : json()}};
  json error;
  if (job.state() == v1::JOB_STATE_FAILED) {
    error = {{"code", "job_failed"}, {"message", job.failure_reason()}, {"param", nullptr}};
  }
  const bool done = IsTerminal(job.state());
  return {
      {"object", "fine_tuning.job"},
      {"id", job.id()},
      {"model", origin != nullptr ? origin->model : spec.model().path()},
      {"created_at", job.created_ms() / 1000},
      {"finished_at", done ? json(job.updated_ms() / 1000) : json()},
      {"fine_tuned_model",
       job.state() == v1::JOB_STATE_SUCCEEDED ? json(FineTunedModel(job, origin)) : json()},
      {"organization_id", job.tenant()},
      {"result_files", json::array()},
      {"status", JobStatus(job.state())},
      {"validation_file", nullptr},
      {"training_file", origin != nullptr ? origin->training_file : spec.data().path()},
      {"hyperparameters", hyperparameters},
      {"method", {{"type", "supervised"}, {"supervised", {{"hyperparameters", hyperparameters}}}}},
      {"trained_tokens", nullptr},
      {"error", error},
      {"seed", spec.seed()},
      {"estimated_finish", nullptr},
      {"integrations", json::array()},
      {"metadata", nullptr},
      // Ballast's own view, for a client that wants more than OpenAI's.
      {"ballast",
       {{"state", StateName(job.state())},
        {"step", job.step()},
        {"max_steps", spec.max_steps()},
        {"output_dir", job.output_dir()}}},
  };
}

json EventObject(const v1::JobEvent& event) {
  std::string level = "info";
  std::string type = "message";
  std::string message;
  json data = json::object();
  if (event.has_state_change()) {
    const v1::StateChange& c = event.state_change();
    message = absl::StrCat("Job ", StateName(c.to()), c.reason().empty() ? "" : ": ", c.reason());
    if (c.to() == v1::JOB_STATE_FAILED) level = "error";
    data = {{"from", StateName(c.from())}, {"to", StateName(c.to())}};
  } else if (event.training().has_step_metrics()) {
    const v1::StepMetrics& m = event.training().step_metrics();
    type = "metrics";
    message = absl::StrCat("Step ", m.step(), "/", m.max_steps(),
                           ": training loss=", m.has_loss() ? absl::StrCat(m.loss()) : "none");
    data = {{"step", m.step()},
            {"total_steps", m.max_steps()},
            {"train_loss", m.has_loss() ? json(m.loss()) : json()},
            {"grad_norm", m.grad_norm()},
            {"learning_rate", m.lr()},
            {"tokens", m.tokens()},
            {"skipped", m.skipped()}};
  } else if (event.training().has_guard()) {
    const v1::GuardEvent& g = event.training().guard();
    level = g.kind() == v1::GuardEvent::KIND_DIAGNOSIS ? "error" : "warn";
    message = absl::StrCat("Guard at step ", g.step(), ": ", g.message());
  } else if (event.training().has_checkpoint_saved()) {
    message = absl::StrCat("Checkpoint saved at step ", event.training().checkpoint_saved().step());
    data = {{"step", event.training().checkpoint_saved().step()}};
  } else if (event.training().has_log()) {
    const v1::LogLine& l = event.training().log();
    level = l.level() == "error" ? "error" : l.level() == "warning" ? "warn" : "info";
    message = absl::StrCat("rank ", l.rank(), ": ", l.text());
  } else if (event.training().has_data()) {
    const v1::DataReport& d = event.training().data();
    message = absl::StrCat("Epoch ", d.epoch(), ": ", d.documents(), " examples, ",
                           d.trained_tokens(), " trained tokens (format ", d.format(), ")");
    data = {{"epoch", d.epoch()}, {"examples", d.documents()}, {"tokens", d.tokens()}};
  } else if (event.training().has_eval()) {
    const v1::EvalReport& e = event.training().eval();
    type = "metrics";
    message = absl::StrCat("Evaluation at step ", e.step(), ": MRR@10 ", e.mrr_at_10());
    data = {{"step", e.step()}, {"mrr_at_10", e.mrr_at_10()}, {"ndcg_at_10", e.ndcg_at_10()}};
  } else {
    message = "an event of a kind this ballastd does not know";
  }
  return {{"object", "fine_tuning.job.event"},
          {"id", absl::StrCat("ftevent-", event.job_id(), "-", event.seq())},
          {"created_at", event.time_ms() / 1000},
          {"level", level},
          {"message", message},
          {"type", type},
          {"data", data}};
}

int64_t EventSeqOfId(absl::string_view id, const std::string& job_id) {
  const std::string prefix = absl::StrCat("ftevent-", job_id, "-");
  int64_t seq = -1;
  if (id.substr(0, prefix.size()) != prefix || !absl::SimpleAtoi(id.substr(prefix.size()), &seq) ||
      seq < 0) {
    return -1;
  }
  return seq;
}

std::vector<json> Checkpoints(const v1::Job& job, const JobOrigin* origin,
                              const std::vector<v1::JobEvent>& events) {
  std::map<int64_t, double> losses;
  std::map<int64_t, const v1::JobEvent*> saved;
  for (const v1::JobEvent& e : events) {
    if (e.training().has_step_metrics() && e.training().step_metrics().has_loss()) {
      losses[e.training().step_metrics().step()] = e.training().step_metrics().loss();
    }
    if (e.training().has_checkpoint_saved()) saved[e.training().checkpoint_saved().step()] = &e;
  }
  std::vector<json> out;
  for (auto it = saved.rbegin(); it != saved.rend(); ++it) {
    const int64_t step = it->first;
    const auto loss = losses.find(step);
    out.push_back(
        {{"object", "fine_tuning.job.checkpoint"},
         {"id", absl::StrCat("ftckpt-", job.id(), "-", step)},
         {"created_at", it->second->time_ms() / 1000},
         {"step_number", step},
         {"fine_tuning_job_id", job.id()},
         {"fine_tuned_model_checkpoint",
          absl::StrCat(FineTunedModel(job, origin), ":ckpt-step-", step)},
         {"metrics",
          {{"step", step}, {"train_loss", loss == losses.end() ? json() : json(loss->second)}}},
         {"ballast", {{"path", it->second->training().checkpoint_saved().path()}}}});
  }
  return out;
}

json FileObject(const UploadedFile& file) {
  return {{"object", "file"},          {"id", file.id},
          {"bytes", file.bytes},       {"created_at", file.created_at},
          {"filename", file.filename}, {"purpose", file.purpose},
          {"status", "processed"},     {"status_details", nullptr},
          {"sha256", file.sha256}};
}

absl::StatusOr<json> ListPage(const std::vector<json>& items, const std::string& after,
                              int64_t limit) {
  size_t begin = 0;
  if (!after.empty()) {
    while (begin < items.size() && items[begin].at("id") != after) ++begin;
    if (begin == items.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("after: '", after.substr(0, 80), "' is not an id of this list"));
    }
    ++begin;
  }
  const size_t end = std::min(items.size(), begin + static_cast<size_t>(limit));
  json data = json::array();
  for (size_t i = begin; i < end; ++i) data.push_back(items[i]);
  return json{{"object", "list"}, {"data", data}, {"has_more", end < items.size()}};
}

int ErrorStatus(const absl::Status& status) {
  // OpenAI's own two: a quota is 429, a request the job's state refuses 400;
  // the rest as every HTTP route of ballastd answers.
  if (status.code() == absl::StatusCode::kResourceExhausted) return 429;
  if (status.code() == absl::StatusCode::kFailedPrecondition) return 400;
  return HttpStatusOf(status);
}

namespace {

std::string ErrorObject(int http_status, std::string code, absl::string_view message,
                        absl::string_view param) {
  const char* type = http_status >= 500   ? "server_error"
                     : http_status == 429 ? "insufficient_quota"
                                          : "invalid_request_error";
  return json({{"error",
                {{"message", std::string(message)},
                 {"type", type},
                 {"param", param.empty() ? json() : json(std::string(param))},
                 {"code", std::move(code)}}}})
             .dump(-1, ' ', false, json::error_handler_t::replace) +
         "\n";
}

}  // namespace

std::string ErrorBody(const absl::Status& status, absl::string_view param) {
  const int http = ErrorStatus(status);
  std::string code = absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
  if (http == 401) code = "invalid_api_key";
  if (http == 429) code = "insufficient_quota";
  return ErrorObject(http, std::move(code), status.message(), param);
}

std::string ErrorBodyOfHttpStatus(int http_status, absl::string_view message,
                                  absl::string_view param) {
  std::string code;
  switch (http_status) {
    case 403:
      code = "permission_denied";
      break;
    case 404:
      code = "not_found";
      break;
    case 405:
      code = "method_not_allowed";
      break;
    case 413:
      code = "request_too_large";
      break;
    default:
      code = absl::StrCat("http_", http_status);
  }
  return ErrorObject(http_status, std::move(code), message, param);
}

absl::StatusOr<CreatedJob> SpecOfCreateRequest(const json& request, const ModelChoice& model,
                                               const UploadedFile& file, uint64_t random_seed,
                                               std::string* param) {
  const auto refuse = [&](const char* field, const std::string& why) {
    *param = field;
    return absl::InvalidArgumentError(why);
  };
  for (const char* unsupported : {"validation_file", "integrations"}) {
    if (const auto it = request.find(unsupported); it != request.end() && !it->is_null()) {
      return refuse(unsupported, absl::StrCat(unsupported,
                                              " is not supported by Ballast (see "
                                              "docs/openai-api.md)"));
    }
  }
  json hyperparameters = request.value("hyperparameters", json::object());
  if (const auto method = request.find("method"); method != request.end() && !method->is_null()) {
    const std::string type = method->is_object() && method->value("type", json()).is_string()
                                 ? method->at("type").get<std::string>()
                                 : "";
    if (type != "supervised") {
      return refuse(
          "method.type",
          absl::StrCat("method.type '", type.substr(0, 32),
                       "': only supervised is supported (dpo and reinforcement are not)"));
    }
    // The method's hyperparameters, OpenAI's newer place for them, win.
    const json supervised = method->value("supervised", json::object());
    const json given =
        supervised.is_object() ? supervised.value("hyperparameters", json::object()) : json();
    if (given.is_object() && hyperparameters.is_object()) {
      for (const auto& [key, value] : given.items()) hyperparameters[key] = value;
    }
  }
  if (!hyperparameters.is_object()) return refuse("hyperparameters", "hyperparameters: an object");
  double epochs = kAutoEpochs;
  double batch = static_cast<double>(std::min(kAutoBatchSize, file.records));
  double multiplier = 1;
  for (auto [name, low, high, integer, out] :
       {std::tuple{"n_epochs", 1.0, double(kMaxEpochs), true, &epochs},
        std::tuple{"batch_size", 1.0, double(kMaxBatchSize), true, &batch},
        std::tuple{"learning_rate_multiplier", 0.0, kMaxMultiplier, false, &multiplier}}) {
    if (absl::Status s = Hyperparameter(hyperparameters, name, low, high, integer, out); !s.ok()) {
      *param = absl::StrCat("hyperparameters.", name);
      return s;
    }
  }
  CreatedJob created;
  if (const json model = request.value("model", json()); model.is_string()) {
    created.origin.model = model.get<std::string>();
  }
  created.origin.training_file = file.id;
  created.origin.n_epochs = static_cast<int64_t>(epochs);
  created.origin.batch_size = static_cast<int64_t>(batch);
  created.origin.learning_rate_multiplier = multiplier;
  if (const auto it = request.find("suffix"); it != request.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().size() > kMaxSuffix) {
      return refuse("suffix", "suffix: a string of at most 64 characters");
    }
    created.origin.suffix = it->get<std::string>();
  }
  v1::JobSpec overrides;
  if (const auto it = request.find("ballast"); it != request.end() && !it->is_null()) {
    absl::StatusOr<v1::JobSpec> parsed =
        ParseJobSpecJson(it->dump(-1, ' ', false, json::error_handler_t::replace));
    if (!parsed.ok()) return refuse("ballast", std::string(parsed.status().message()));
    overrides = *std::move(parsed);
  }
  v1::JobSpec& spec = created.spec;
  spec.set_name(created.origin.suffix.empty() ? "openai" : created.origin.suffix);
  spec.mutable_model()->set_path(model.path);
  spec.set_method(overrides.method().empty() ? "lora" : overrides.method());
  spec.mutable_data()->set_path(file.path);
  spec.mutable_data()->set_format("messages");
  spec.mutable_data()->set_seq_len(static_cast<int32_t>(
      std::min(model.max_position_embeddings > 0 ? model.max_position_embeddings : kMaxAutoSeqLen,
               kMaxAutoSeqLen)));
  spec.mutable_data()->set_truncate("cut");
  // One chat per micro-batch (no padding), accumulated to the batch over
  // the devices.
  const int64_t devices = std::max(1, overrides.devices());
  if (created.origin.batch_size % devices != 0) {
    return refuse("hyperparameters.batch_size",
                  absl::StrCat("batch_size ", created.origin.batch_size,
                               " must be a multiple of ballast.devices ", devices));
  }
  spec.mutable_data()->set_micro_batch_size(1);
  spec.mutable_data()->set_grad_accum_steps(
      static_cast<int32_t>(created.origin.batch_size / devices));
  const int64_t steps_per_epoch =
      (file.records + created.origin.batch_size - 1) / created.origin.batch_size;
  spec.set_max_steps(steps_per_epoch * created.origin.n_epochs);
  spec.set_checkpoint_every(steps_per_epoch);
  spec.mutable_optimizer()->set_lr(
      multiplier * (spec.method() == "full" ? kBaseLearningRateFull : kBaseLearningRateLora));
  spec.mutable_schedule()->set_kind("linear");
  if (const auto it = request.find("seed"); it != request.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return refuse("seed", "seed: a non-negative integer");
    }
    spec.set_seed(it->get<uint64_t>());
  } else {
    spec.set_seed(random_seed);
  }
  spec.MergeFrom(overrides);
  return created;
}

}  // namespace ballast::server::openai
