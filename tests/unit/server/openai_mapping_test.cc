#include "server/openai_mapping.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "absl/strings/str_cat.h"

namespace ballast::server::openai {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(OpenAiMappingTest, EveryJobStateHasItsOpenAiStatus) {
  const std::map<v1::JobState, std::string> expected = {
      {v1::JOB_STATE_QUEUED, "queued"},        {v1::JOB_STATE_SCHEDULED, "validating_files"},
      {v1::JOB_STATE_RUNNING, "running"},      {v1::JOB_STATE_ROLLING_BACK, "running"},
      {v1::JOB_STATE_SUCCEEDED, "succeeded"},  {v1::JOB_STATE_FAILED, "failed"},
      {v1::JOB_STATE_CANCELLING, "cancelled"}, {v1::JOB_STATE_CANCELLED, "cancelled"}};
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s == v1::JOB_STATE_UNSPECIFIED) continue;
    const auto state = static_cast<v1::JobState>(s);
    ASSERT_EQ(expected.count(state), 1u) << "a new state needs its OpenAI status: " << s;
    EXPECT_EQ(JobStatus(state), expected.at(state)) << v1::JobState_Name(state);
  }
}

TEST(OpenAiMappingTest, PagesWalkTheWholeListInOrder) {
  std::mt19937 random(std::random_device{}());
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<json> items;
    const int n = static_cast<int>(random() % 40);
    for (int i = 0; i < n; ++i) items.push_back({{"id", absl::StrCat("x-", random())}});
    const int64_t limit = 1 + random() % 10;
    std::vector<json> walked;
    std::string after;
    for (bool more = true; more;) {
      absl::StatusOr<json> page = ListPage(items, after, limit);
      ASSERT_TRUE(page.ok()) << page.status();
      EXPECT_EQ((*page)["object"], "list");
      ASSERT_LE((*page)["data"].size(), static_cast<size_t>(limit));
      for (const json& item : (*page)["data"]) walked.push_back(item);
      more = (*page)["has_more"];
      EXPECT_EQ(more, walked.size() < items.size());
      if (!walked.empty()) after = walked.back()["id"];
      if (more) EXPECT_EQ((*page)["data"].size(), static_cast<size_t>(limit));
    }
    EXPECT_EQ(walked, items);
  }
  EXPECT_THAT(ListPage({{{"id", "a"}}}, "zz", 5).status().message(),
              HasSubstr("after: 'zz' is not an id of this list"));
}

TEST(OpenAiMappingTest, ErrorsAreOpenAisErrorObject) {
  const json error = json::parse(ErrorBody(absl::NotFoundError("job x not found")));
  EXPECT_EQ(error, json::parse(R"({"error": {"message": "job x not found", "type":
      "invalid_request_error", "param": null, "code": "not_found"}})"));
  EXPECT_EQ(json::parse(ErrorBody(absl::InvalidArgumentError("bad"), "suffix"))["error"]["param"],
            "suffix");
  EXPECT_EQ(json::parse(ErrorBody(absl::UnauthenticatedError("no")))["error"]["code"],
            "invalid_api_key");
  EXPECT_EQ(json::parse(ErrorBody(absl::InternalError("disk")))["error"]["type"], "server_error");
  EXPECT_EQ(ErrorStatus(absl::InvalidArgumentError("")), 400);
  EXPECT_EQ(ErrorStatus(absl::FailedPreconditionError("")), 400);
  EXPECT_EQ(ErrorStatus(absl::UnauthenticatedError("")), 401);
  EXPECT_EQ(ErrorStatus(absl::PermissionDeniedError("")), 403);
  EXPECT_EQ(ErrorStatus(absl::NotFoundError("")), 404);
  EXPECT_EQ(ErrorStatus(absl::ResourceExhaustedError("")), 429);
  EXPECT_EQ(ErrorStatus(absl::InternalError("")), 500);
  // What the HTTP endpoint answers before a route runs, in the same object.
  const json too_large = json::parse(ErrorBodyOfHttpStatus(413, "too big"))["error"];
  EXPECT_EQ(too_large["code"], "request_too_large");
  EXPECT_EQ(too_large["type"], "invalid_request_error");
  EXPECT_EQ(too_large["message"], "too big");
  EXPECT_TRUE(too_large["param"].is_null());
  EXPECT_EQ(json::parse(ErrorBodyOfHttpStatus(403, ""))["error"]["code"], "permission_denied");
  EXPECT_EQ(json::parse(ErrorBodyOfHttpStatus(405, ""))["error"]["code"], "method_not_allowed");
}

UploadedFile File(int64_t records) {
  UploadedFile file;
  file.id = "file-0123456789abcdef01234567";
  file.path = "/out/uploads-t/file-0123456789abcdef01234567.jsonl";
  file.records = records;
  return file;
}

TEST(OpenAiMappingTest, AutoHyperparametersTakeTheDocumentedDefaults) {
  std::mt19937 random(std::random_device{}());
  const int64_t records = 1 + random() % 1000;
  const int64_t max_positions = 1 + random() % 10000;
  std::string param;
  absl::StatusOr<CreatedJob> created =
      SpecOfCreateRequest(json::parse(R"({"model": "m", "hyperparameters": {"n_epochs": "auto"}})"),
                          ModelChoice{"/models/m", max_positions}, File(records), 42, &param);
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::JobSpec& spec = created->spec;
  const int64_t batch = std::min<int64_t>(kAutoBatchSize, records);
  EXPECT_EQ(created->origin.n_epochs, kAutoEpochs);
  EXPECT_EQ(created->origin.batch_size, batch);
  EXPECT_EQ(created->origin.learning_rate_multiplier, 1);
  EXPECT_EQ(spec.model().path(), "/models/m");
  EXPECT_EQ(spec.method(), "lora");
  EXPECT_EQ(spec.data().path(), File(records).path);
  EXPECT_EQ(spec.data().seq_len(), std::min<int64_t>(max_positions, kMaxAutoSeqLen));
  EXPECT_EQ(spec.data().micro_batch_size() * spec.data().grad_accum_steps(), batch);
  EXPECT_EQ(spec.max_steps(), (records + batch - 1) / batch * kAutoEpochs);
  EXPECT_EQ(spec.checkpoint_every(), (records + batch - 1) / batch);
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), kBaseLearningRateLora);
  EXPECT_EQ(spec.seed(), 42u);
}

TEST(OpenAiMappingTest, GivenValuesAndTheBallastObjectShapeTheSpec) {
  std::string param;
  absl::StatusOr<CreatedJob> created =
      SpecOfCreateRequest(json::parse(R"({"model": "m", "seed": 9, "suffix": "s",
        "method": {"type": "supervised", "supervised": {"hyperparameters":
          {"n_epochs": 2, "batch_size": 6, "learning_rate_multiplier": 0.5}}},
        "ballast": {"method": "full", "devices": 3, "lora": {"r": 4}, "data": {"seq_len": 64}}})"),
                          ModelChoice{"/m", 128}, File(13), 1, &param);
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::JobSpec& spec = created->spec;
  EXPECT_EQ(spec.seed(), 9u);
  EXPECT_EQ(spec.name(), "s");
  EXPECT_EQ(spec.method(), "full");
  EXPECT_DOUBLE_EQ(spec.optimizer().lr(), 0.5 * kBaseLearningRateFull);
  EXPECT_EQ(spec.devices(), 3);
  EXPECT_EQ(spec.data().grad_accum_steps(), 2);  // 6 chats over 3 devices
  EXPECT_EQ(spec.max_steps(), 3 * 2);            // ceil(13 / 6) per epoch
  EXPECT_EQ(spec.lora().r(), 4);
  EXPECT_EQ(spec.data().seq_len(), 64);
}

TEST(OpenAiMappingTest, BadParametersNameTheirField) {
  const auto refused = [](const std::string& request) {
    std::string param;
    absl::StatusOr<CreatedJob> created =
        SpecOfCreateRequest(json::parse(request), ModelChoice{"/m", 128}, File(10), 1, &param);
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << request;
    return param;
  };
  EXPECT_EQ(refused(R"({"hyperparameters": {"n_epochs": 0}})"), "hyperparameters.n_epochs");
  EXPECT_EQ(refused(R"({"hyperparameters": {"batch_size": 2.5}})"), "hyperparameters.batch_size");
  EXPECT_EQ(refused(R"({"hyperparameters": {"learning_rate_multiplier": 0}})"),
            "hyperparameters.learning_rate_multiplier");
  EXPECT_EQ(refused(R"({"method": {"type": "dpo"}})"), "method.type");
  EXPECT_EQ(refused(R"({"validation_file": "file-x"})"), "validation_file");
  EXPECT_EQ(refused(R"({"suffix": 5})"), "suffix");
  EXPECT_EQ(refused(R"({"seed": -1})"), "seed");
  EXPECT_EQ(refused(R"({"ballast": {"no_such_field": 1}})"), "ballast");
  EXPECT_EQ(refused(R"({"hyperparameters": {"batch_size": 3}, "ballast": {"devices": 2}})"),
            "hyperparameters.batch_size");
}

TEST(OpenAiMappingTest, JobEventsAndCheckpointsCarryTheirFacts) {
  v1::Job job;
  job.set_id("job-0123456789ab");
  job.set_tenant("team-a");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_created_ms(5000);
  job.set_updated_ms(9000);
  JobOrigin origin{"tiny", "file-x", 2, 4, 1.5, "sums"};
  const json object = JobObject(job, &origin);
  EXPECT_EQ(object["status"], "succeeded");
  EXPECT_EQ(object["fine_tuned_model"], "ft:tiny:team-a:sums:job-0123456789ab");
  EXPECT_EQ(object["created_at"], 5);
  EXPECT_EQ(object["finished_at"], 9);
  EXPECT_EQ(object["hyperparameters"]["learning_rate_multiplier"], 1.5);
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_failure_reason("rank 0 exited 1");
  EXPECT_EQ(JobObject(job, &origin)["error"]["message"], "rank 0 exited 1");
  EXPECT_TRUE(JobObject(job, &origin)["fine_tuned_model"].is_null());

  std::vector<v1::JobEvent> events;
  for (int64_t step = 1; step <= 4; ++step) {
    v1::JobEvent& metrics = events.emplace_back();
    metrics.set_job_id(job.id());
    metrics.set_seq(2 * step - 1);
    metrics.mutable_training()->mutable_step_metrics()->set_step(step);
    metrics.mutable_training()->mutable_step_metrics()->set_loss(10.0 / step);
    if (step % 2 == 0) {
      v1::JobEvent& saved = events.emplace_back();
      saved.set_job_id(job.id());
      saved.set_seq(2 * step);
      saved.mutable_training()->mutable_checkpoint_saved()->set_step(step);
    }
  }
  const json metrics = EventObject(events[0]);
  EXPECT_EQ(metrics["type"], "metrics");
  EXPECT_EQ(metrics["id"], "ftevent-job-0123456789ab-1");
  EXPECT_EQ(metrics["data"]["train_loss"], 10.0);
  EXPECT_EQ(EventSeqOfId(metrics["id"].get<std::string>(), job.id()), 1);
  EXPECT_EQ(EventSeqOfId("ftevent-job-other-1", job.id()), -1);
  const std::vector<json> checkpoints = Checkpoints(job, &origin, events);
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0]["step_number"], 4);
  EXPECT_EQ(checkpoints[0]["metrics"]["train_loss"], 2.5);
  EXPECT_EQ(checkpoints[1]["step_number"], 2);
  EXPECT_EQ(checkpoints[1]["fine_tuned_model_checkpoint"],
            "ft:tiny:team-a:sums:job-0123456789ab:ckpt-step-2");
}

TEST(OpenAiMappingTest, ChatFilesAreCheckedLineByLine) {
  int64_t records = 0;
  const std::string good =
      R"({"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}]})";
  ASSERT_TRUE(CheckChatJsonl(good + "\n\n" + good + "\n", &records).ok());
  EXPECT_EQ(records, 2);
  const auto problem = [&](const std::string& second_line) {
    return std::string(CheckChatJsonl(good + "\n" + second_line, &records).message());
  };
  EXPECT_THAT(problem("{"), HasSubstr("line 2 of the file is not a chat record: not valid JSON"));
  EXPECT_THAT(problem("[]"), HasSubstr("not a JSON object"));
  EXPECT_THAT(problem(R"({"prompt": "x"})"), HasSubstr("no \"messages\" array"));
  EXPECT_THAT(problem(R"({"messages": [{"role": "robot", "content": "x"}]})"),
              HasSubstr("messages[0] has no role among"));
  EXPECT_THAT(problem(R"({"messages": [{"role": "user", "content": 3}]})"),
              HasSubstr("messages[0] has no string \"content\""));
  EXPECT_THAT(problem(R"({"messages": [{"role": "user", "content": "x"}]})"),
              HasSubstr("no assistant message"));
  EXPECT_THAT(CheckChatJsonl("\n \n", &records).message(), HasSubstr("holds no chat record"));
}

}  // namespace
}  // namespace ballast::server::openai
