#include "client/job_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "absl/strings/str_split.h"
#include "client/connection.h"

namespace ballast::client {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kNow = 1'700'000'000'000;

v1::Job RunningJob() {
  v1::Job job;
  job.set_id("job-0123456789ab");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_spec()->set_name("demo");
  job.mutable_spec()->set_max_steps(200);
  job.set_step(12);
  job.set_created_ms(kNow - 92'000);
  job.set_last_seq(40);
  return job;
}

TEST(JobFormat, StateNamesDropThePrefixAndParseAnyCase) {
  EXPECT_EQ(StateName(v1::JOB_STATE_ROLLING_BACK), "ROLLING_BACK");
  EXPECT_EQ(*ParseState("running"), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(*ParseState("Rolling_Back"), v1::JOB_STATE_ROLLING_BACK);
  EXPECT_EQ(*ParseState("JOB_STATE_FAILED"), v1::JOB_STATE_FAILED);
  absl::StatusOr<v1::JobState> bad = ParseState("done");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("succeeded"));
  EXPECT_FALSE(ParseState("unspecified").ok());
}

TEST(JobFormat, JsonUsesProtoFieldNamesAndPrintsZeros) {
  v1::Job job = RunningJob();
  const std::string text = ToJson(job);
  EXPECT_EQ(text.find('\n'), std::string::npos) << "one document per line";
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["id"], "job-0123456789ab");
  EXPECT_EQ(j["state"], "JOB_STATE_RUNNING");
  EXPECT_EQ(j["last_seq"], "40");  // proto3 JSON writes int64 as a string
  EXPECT_EQ(j["spec"]["max_steps"], "200");
  EXPECT_EQ(j["restarts"], 0) << "zero scalars are printed, so scripts can rely on them";
  EXPECT_EQ(j["failure_reason"], "");
}

TEST(JobFormat, JobTableAlignsColumns) {
  v1::Job second = RunningJob();
  second.set_id("job-ffffffffffff");
  second.set_state(v1::JOB_STATE_SUCCEEDED);
  second.mutable_spec()->set_name("a-much-longer-name");
  second.set_step(200);
  second.mutable_last_step()->set_step(200);  // a last step without a loss
  v1::Job first = RunningJob();
  first.mutable_last_step()->set_loss(2.34119);
  const std::string table = JobTable({first, second}, kNow);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "ID                STATE      NAME                STEP     LOSS    AGE");
  EXPECT_EQ(lines[1], "job-0123456789ab  RUNNING    demo                12/200   2.3412  1m32s");
  EXPECT_EQ(lines[2], "job-ffffffffffff  SUCCEEDED  a-much-longer-name  200/200  -       1m32s");
}

TEST(JobFormat, WorkerTableShowsLoadAndHeartbeatAge) {
  v1::Worker w;
  w.set_id("w-1");
  w.set_host("node-a");
  w.set_device_kind("cuda");
  w.set_capacity(8);
  w.set_busy(3);
  w.set_alive(true);
  w.set_last_heartbeat_ms(kNow - 4'000);
  const std::vector<std::string> lines =
      absl::StrSplit(WorkerTable({w}, kNow), '\n', absl::SkipEmpty());
  EXPECT_THAT(lines, ElementsAre("ID   HOST    KIND  BUSY/CAP  ALIVE  LAST HEARTBEAT",
                                 "w-1  node-a  cuda  3/8       yes    4s ago"));
}

TEST(JobFormat, EventLinesForEverythingButStepsAndInfoLogs) {
  v1::JobEvent e;
  e.mutable_state_change()->set_from(v1::JOB_STATE_RUNNING);
  e.mutable_state_change()->set_to(v1::JOB_STATE_FAILED);
  e.mutable_state_change()->set_reason("rank 0 exited 1");
  EXPECT_EQ(EventLine(e), "state RUNNING -> FAILED: rank 0 exited 1");

  v1::TrainingEvent* t = e.mutable_training();
  t->mutable_guard()->set_kind(v1::GuardEvent::KIND_ROLLBACK);
  t->mutable_guard()->set_step(40);
  t->mutable_guard()->set_to_step(30);
  t->mutable_guard()->set_message("3 non-finite steps");
  EXPECT_EQ(EventLine(e), "guard rollback at step 40 to step 30: 3 non-finite steps");

  t->mutable_checkpoint_saved()->set_step(100);
  t->mutable_checkpoint_saved()->set_path("/out/checkpoints/step-100");
  EXPECT_EQ(EventLine(e), "checkpoint step 100: /out/checkpoints/step-100");

  t->mutable_log()->set_rank(1);
  t->mutable_log()->set_level("warning");
  t->mutable_log()->set_text("slow data");
  EXPECT_EQ(EventLine(e), "[rank 1] warning: slow data");
  t->mutable_log()->set_level("info");
  EXPECT_EQ(EventLine(e), std::nullopt);
  EXPECT_EQ(LogLineText(t->log()), "[rank 1] slow data");

  t->mutable_step_metrics()->set_step(3);
  EXPECT_EQ(EventLine(e), std::nullopt);
  // A kind this CLI does not know (newer than it) prints nothing.
  t->Clear();
  EXPECT_EQ(EventLine(e), std::nullopt);
}

TEST(JobFormat, ControlCharactersFromOtherUsersArePrintedEscaped) {
  // A job name that clears the screen and forges a row, a worker id with a
  // C1 CSI: printed as text, on their own line.
  v1::Job job;
  job.set_id("job-1");
  job.mutable_spec()->set_name("x\x1b[2J\njob-2  SUCCEEDED");
  const std::string table = JobTable({job}, kNow);
  EXPECT_THAT(table, HasSubstr("x\\x1b[2J\\x0ajob-2  SUCCEEDED"));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2);
  v1::Worker w;
  w.set_id(
      "w-\xc2\x9b"
      "31m");
  EXPECT_THAT(WorkerTable({w}, kNow), HasSubstr("w-\\u009b31m"));
  EXPECT_EQ(Printable("caf\xc3\xa9 \xe2\x9c\x93"), "caf\xc3\xa9 \xe2\x9c\x93");  // UTF-8 stays

  v1::JobEvent e;
  e.mutable_training()->mutable_log()->set_level("warning");
  e.mutable_training()->mutable_log()->set_text("a\rb");
  EXPECT_EQ(EventLine(e), "[rank 0] warning: a\\x0db");
}

TEST(JobFormat, GuardLinesPutTheFactsBeforeTheMessage) {
  v1::GuardEvent g;
  g.set_kind(v1::GuardEvent::KIND_ROLLBACK);
  g.set_step(7);
  g.set_to_step(2);
  g.set_trigger("non_finite");
  g.set_verdict(v1::GuardEvent::VERDICT_DETERMINISTIC);
  g.set_module("model.layers.1.mlp.down_proj.lora_B.weight");
  g.set_rank(1);
  g.set_steps_lost(5);
  g.set_documents_skipped(20);
  g.set_first_document(8);
  g.set_message("non-finite gradient");
  EXPECT_EQ(GuardLine(g),
            "guard rollback at step 7 to step 2 [non_finite, deterministic, "
            "model.layers.1.mlp.down_proj.lora_B.weight on rank 1, 5 steps lost, 20 documents "
            "skipped from position 8]: non-finite gradient");
  g.Clear();
  g.set_kind(v1::GuardEvent::KIND_RECOVERED);
  g.set_step(3);
  g.set_trigger("spike");
  g.set_verdict(v1::GuardEvent::VERDICT_TRANSIENT);
  EXPECT_EQ(GuardLine(g), "guard recovered step 3 [spike, transient]");
}

TEST(JobFormat, DetailSumsUpTheGuard) {
  v1::Job job;
  job.set_id("job-1");
  EXPECT_THAT(JobDetail(job, 0), Not(HasSubstr("GUARD")));
  job.set_guard_rollbacks(1);
  job.set_skipped_steps(2);
  (*job.mutable_anomalies())["spike"] = 1;
  (*job.mutable_anomalies())["non_finite"] = 3;
  job.mutable_last_guard_event()->set_kind(v1::GuardEvent::KIND_SKIP);
  job.mutable_last_guard_event()->set_step(9);
  const std::string detail = JobDetail(job, 0);
  EXPECT_THAT(detail, HasSubstr("1 rollbacks, 2 skipped steps; anomalies: non_finite 3, spike 1"));
  EXPECT_THAT(detail, HasSubstr("guard skip at step 9"));
}

TEST(JobFormat, DataLinesCountWhatWasLost) {
  v1::DataReport d;
  d.set_epoch(1);
  d.set_format("messages");
  d.set_template_("qwen3");
  d.set_records(10);
  d.set_documents(7);
  d.set_tokens(300);
  d.set_trained_tokens(120);
  d.set_rows(2);
  d.set_packing_efficiency(0.9375);
  EXPECT_EQ(DataLine(d),
            "data epoch 1: messages (qwen3), 7 documents of 10 records, 300 tokens (120 trained), "
            "2 rows, packing 93.8%");
  d.set_skipped_records(2);
  d.add_bad_record_examples("d.jsonl:4: not a JSON object");
  d.set_cut_documents(1);
  d.set_dropped_documents(1);
  EXPECT_THAT(DataLine(d), HasSubstr("93.8%; 2 bad records skipped, 1 cut, 1 dropped; first: "
                                     "d.jsonl:4: not a JSON object"));
  d.set_special_token_records(3);
  EXPECT_THAT(DataLine(d), HasSubstr("93.8%; 3 records with special-token text, as plain text; 2 "
                                     "bad records skipped"));
  d.set_special_tokens_allowed(true);
  EXPECT_THAT(DataLine(d), HasSubstr("3 records with special-token text, as special tokens; 2 "));
  v1::Job job;
  EXPECT_THAT(JobDetail(job, 0), Not(HasSubstr("DATA")));
  *job.mutable_data() = d;
  EXPECT_THAT(JobDetail(job, 0), HasSubstr("DATA"));
  v1::JobEvent event;
  *event.mutable_training()->mutable_data() = d;
  EXPECT_THAT(EventLine(event), testing::Optional(HasSubstr("data epoch 1: messages")));
}

TEST(JobFormat, DetailShowsEachRanksPlaceAndTheExitOfThoseGone) {
  v1::Job job = RunningJob();
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankPlacement* p = job.add_placement();
    p->set_rank(rank);
    p->set_worker_id("worker-a");
    p->set_device(rank);
  }
  job.mutable_placement(1)->set_exit_code(0);
  const std::string detail = JobDetail(job, kNow);
  EXPECT_THAT(detail, HasSubstr("worker-a device 0\n"));
  EXPECT_THAT(detail, HasSubstr("worker-a device 1, exited 0\n"));
}

TEST(JobFormat, FinalLineCarriesTheFailureReason) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_failure_reason("grad_norm non-finite at step 7 in layers.3.mlp");
  EXPECT_EQ(FinalLine(job),
            "job-0123456789ab FAILED: grad_norm non-finite at step 7 in layers.3.mlp");
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.set_failure_reason("requeued once");
  EXPECT_EQ(FinalLine(job), "job-0123456789ab SUCCEEDED");
}

TEST(JobFormat, DetailAndFinalLineShowTheStopAndTheExport) {
  v1::Job job = RunningJob();
  EXPECT_THAT(JobDetail(job, kNow), Not(HasSubstr("EXPORTED")));
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  v1::TrainingEnd* end = job.mutable_end();
  end->set_step(20);
  end->set_exported_step(20);
  end->set_export_reason("the last step");
  EXPECT_THAT(JobDetail(job, kNow), HasSubstr("EXPORTED    step 20: the last step\n"));
  EXPECT_THAT(JobDetail(job, kNow), Not(HasSubstr("STOPPED")));
  EXPECT_EQ(FinalLine(job), "job-0123456789ab SUCCEEDED");
  end->set_step(12);
  end->set_stop_reason(
      "stopped early at step 12: eval_loss did not improve by 0.01 for 3 evaluations since step 6");
  end->set_exported_step(6);
  end->set_export_reason("the best eval_loss, 1.234 at step 6");
  const std::string detail = JobDetail(job, kNow);
  EXPECT_THAT(detail, HasSubstr("STOPPED     stopped early at step 12: eval_loss did not improve "
                                "by 0.01 for 3 evaluations since step 6\n"));
  EXPECT_THAT(detail, HasSubstr("EXPORTED    step 6: the best eval_loss, 1.234 at step 6\n"));
  EXPECT_EQ(FinalLine(job),
            "job-0123456789ab SUCCEEDED: stopped early at step 12: eval_loss did not improve by "
            "0.01 for 3 evaluations since step 6");
  v1::JobEvent event;
  *event.mutable_training()->mutable_end() = *end;
  EXPECT_EQ(EventLine(event),
            "stopped early at step 12: eval_loss did not improve by 0.01 for 3 evaluations since "
            "step 6; exported step 6 (the best eval_loss, 1.234 at step 6)");
  v1::EvalReport eval;
  eval.set_step(6);
  eval.set_loss(1.234);
  eval.set_supervised_tokens(100);
  eval.set_best(true);
  EXPECT_EQ(EvalLine(eval),
            "eval step 6: loss 1.2340 over 100 supervised tokens (the best so far)");
}

TEST(ExitCodes, MapFromGrpcStatus) {
  auto code = [](grpc::StatusCode c) { return ExitCodeFor(ToAbsl(grpc::Status(c, "m")).code()); };
  EXPECT_EQ(ExitCodeFor(absl::StatusCode::kOk), 0);
  EXPECT_EQ(code(grpc::StatusCode::NOT_FOUND), 1);
  EXPECT_EQ(code(grpc::StatusCode::FAILED_PRECONDITION), 1);
  EXPECT_EQ(code(grpc::StatusCode::INTERNAL), 1);
  EXPECT_EQ(code(grpc::StatusCode::INVALID_ARGUMENT), 2);
  EXPECT_EQ(code(grpc::StatusCode::UNAUTHENTICATED), 2);
  EXPECT_EQ(code(grpc::StatusCode::UNAVAILABLE), 3);
  EXPECT_EQ(code(grpc::StatusCode::DEADLINE_EXCEEDED), 3);
  EXPECT_EQ(code(grpc::StatusCode::CANCELLED), 130);
  EXPECT_EQ(ToAbsl(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lora.r: 1..4096")).message(),
            "lora.r: 1..4096");
}

}  // namespace
}  // namespace ballast::client
