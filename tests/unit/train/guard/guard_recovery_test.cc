// The guard's closed loop in a real Trainer on the tiny model: faults
// injected by the spec (guard.inject) or planted in the weights and the
// data, and what the run does about them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "tests/unit/train/tiny_model.h"
#include "tests/unit/train/trainer_reports.h"
#include "worker/train/checkpoint/checkpoint.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/trainer/trainer.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::Contains;
using ::testing::HasSubstr;

// The token no document holds unless a test plants it.
constexpr int64_t kPoisonToken = TinyModel::kVocab - 1;

class GuardRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "guard_recovery.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/21);
    WriteData({});
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  // 64 documents of random tokens below kPoisonToken; those at `poisoned`
  // lines also hold kPoisonToken. With `masked`, every label is -100.
  void WriteData(const std::vector<int>& poisoned, bool masked = false) {
    data_ = (fs::path(dir_) / "data.jsonl").string();
    at::Generator gen = at::detail::createCPUGenerator(22);
    std::ofstream out(data_);
    for (int d = 0; d < 64; ++d) {
      const int64_t n = 6 + at::randint(6, {1}, gen).item<int64_t>();
      at::Tensor ids = at::randint(kPoisonToken, {n}, gen);
      std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
      if (std::find(poisoned.begin(), poisoned.end(), d) != poisoned.end()) v[2] = kPoisonToken;
      out << "{\"input_ids\": [" << absl::StrJoin(v, ", ") << "]";
      if (masked) {
        out << ", \"labels\": [" << absl::StrJoin(std::vector<int>(v.size(), -100), ", ") << "]";
      }
      out << "}\n";
    }
  }

  // LoRA on the tiny model for 12 steps of 4 documents, with the guard
  // section `guard` (by default one that snapshots every 2 steps and trusts
  // a state after 2 clean ones).
  v1::JobSpec Spec(const std::string& guard = "{snapshot_every: 2, good_after_steps: 2}") const {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
        "model: {path: " + model_ + "}\n" + "data: {path: " + data_ +
        ", seq_len: 16, micro_batch_size: 2, grad_accum_steps: 2, shuffle: false}\n"
        "lora: {r: 4, target_modules: [q_proj, v_proj, down_proj]}\n"
        "optimizer: {lr: 0.01}\nmax_steps: 12\nguard: " +
        guard + "\n");
    EXPECT_TRUE(spec.ok()) << spec.status();
    ApplyDefaults(&*spec);
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
    return *spec;
  }

  // NaN planted in `weights` (a view of a loaded Trainer's): a weight gone
  // bad after the load, which refuses a model holding one.
  static void PlantNaN(at::Tensor weights) {
    weights.fill_(std::numeric_limits<float>::quiet_NaN());
  }

  // The tiny model with `value` at element (row, column) of `tensor`; the
  // error of a Trainer made on it.
  absl::Status CreateOnModelWith(const std::string& tensor, int64_t row, int64_t column,
                                 float value) {
    model_ = WriteTinyQwen3(
        (fs::path(dir_) / "bad_model").string(), /*seed=*/21,
        [&](std::map<std::string, at::Tensor>& t) { t.at(tensor)[row][column].fill_(value); });
    return Trainer::Create(Spec(), out()).status();
  }

  std::unique_ptr<Trainer> Create(const v1::JobSpec& spec, RecordingObserver* observer) const {
    TrainerOptions options;
    options.observer = observer;
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(spec, out(), options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  std::string out() const { return (fs::path(dir_) / "run").string(); }

  std::vector<nlohmann::json> MetricsLines() const { return ReadMetricsLines(out()); }

  // The first step a new Trainer over the same output runs: where it
  // resumed.
  int64_t FirstStepOfAResume(const v1::JobSpec& spec) const {
    RecordingObserver resumed;
    resumed.stop_after = 1;
    std::unique_ptr<Trainer> again = Create(spec, &resumed);
    EXPECT_NE(again, nullptr);
    if (again == nullptr) return -1;
    EXPECT_EQ(again->Run().code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(resumed.steps.size(), 1u);
    EXPECT_FALSE(resumed.steps.empty() || resumed.steps[0].skipped());
    return resumed.steps.empty() ? -1 : resumed.steps[0].step();
  }

  // Every tensor of the exported adapter is finite.
  void ExpectFiniteAdapter() const {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> adapter =
        SafetensorsFile::Open((fs::path(out()) / "adapter" / "adapter_model.safetensors").string());
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    for (const std::string& name : (*adapter)->names()) {
      absl::StatusOr<at::Tensor> t = (*adapter)->tensor(name);
      ASSERT_TRUE(t.ok());
      EXPECT_TRUE(torch::isfinite(*t).all().item<bool>()) << name;
    }
  }

  std::string dir_, model_, data_;
};

TEST_F(GuardRecoveryTest, ANaNStreakIsSkippedThenRolledBackAndTheRunFinishesClean) {
  RecordingObserver observer;
  std::unique_ptr<Trainer> t =
      Create(Spec("{snapshot_every: 2, good_after_steps: 2, lr_cut: 0.5, rewarm_steps: 4,\n"
                  " inject: {nan_grad_at_step: [5, 6, 7]}}"),
             &observer);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());

  // Steps 5 and 6 are skipped, each re-run once and as bad; the event names
  // the rank, the tensor and the step's documents (4 a step, in file order).
  const std::vector<v1::GuardEvent> skips = observer.Of(v1::GuardEvent::KIND_SKIP);
  ASSERT_EQ(skips.size(), 2u);
  EXPECT_EQ(skips[0].step(), 5);
  EXPECT_EQ(skips[0].trigger(), "non_finite");
  EXPECT_EQ(skips[0].verdict(), v1::GuardEvent::VERDICT_DETERMINISTIC);
  EXPECT_EQ(skips[0].rank(), 0);
  EXPECT_EQ(skips[0].module(), t->params().TrainableNames().back());
  EXPECT_THAT(skips[0].document_ids(), ::testing::ElementsAre(16, 17, 18, 19));
  ASSERT_FALSE(skips[0].module_grad_norms().empty());
  EXPECT_EQ(skips[0].module_grad_norms(0).module(), skips[0].module());
  EXPECT_TRUE(std::isnan(skips[0].module_grad_norms(0).grad_norm()));
  EXPECT_TRUE(std::isfinite(skips[0].module_grad_norms(1).grad_norm()));

  // The third in a row rolls back to the newest good snapshot from before
  // step 5: step 2's (step 4's was not yet followed by 2 clean steps), and
  // past the 20 documents read since it.
  const std::vector<v1::GuardEvent> rollbacks = observer.Of(v1::GuardEvent::KIND_ROLLBACK);
  ASSERT_EQ(rollbacks.size(), 1u);
  const v1::GuardEvent& rollback = rollbacks[0];
  EXPECT_EQ(rollback.step(), 7);
  EXPECT_EQ(rollback.to_step(), 2);
  EXPECT_EQ(rollback.steps_lost(), 5);
  EXPECT_EQ(rollback.restored_from(), "snapshot");
  EXPECT_EQ(rollback.first_document(), 8);
  EXPECT_EQ(rollback.documents_skipped(), 20);
  EXPECT_EQ(rollback.document_ids_size(), 20);
  EXPECT_EQ(observer.Of(v1::GuardEvent::KIND_DIAGNOSIS).size(), 0u);

  // The log holds the run that counts: steps 1..12 once each, every one
  // applied and finite; the LR after the rollback is cut to half and
  // re-warmed over 4 steps.
  const std::vector<nlohmann::json> lines = MetricsLines();
  ASSERT_EQ(lines.size(), 12u);
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["step"], static_cast<int64_t>(i) + 1);
    EXPECT_EQ(lines[i]["skipped"], false) << "step " << i + 1;
    EXPECT_TRUE(lines[i]["grad_norm"].is_number()) << "step " << i + 1;
  }
  EXPECT_DOUBLE_EQ(lines[2]["lr"].get<double>(), 0.005);
  EXPECT_DOUBLE_EQ(lines[3]["lr"].get<double>(), 0.00625);
  EXPECT_DOUBLE_EQ(lines[11]["lr"].get<double>(), 0.01);
  // The optimizer went back with the weights: its step counter is that of
  // the 12 applied steps, not of every update ever made (14).
  EXPECT_EQ(t->optimizer().steps(), 12);
  ExpectFiniteAdapter();
}

TEST_F(GuardRecoveryTest, ATransientFaultIsRecoveredByTheReRunAndLosesNothing) {
  RecordingObserver observer;
  std::unique_ptr<Trainer> t = Create(
      Spec("{inject: {nan_grad_at_step: [3], inf_loss_at_step: [6], transient: true}}"), &observer);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());
  const std::vector<v1::GuardEvent> recovered = observer.Of(v1::GuardEvent::KIND_RECOVERED);
  ASSERT_EQ(recovered.size(), 2u);
  EXPECT_EQ(recovered[0].step(), 3);
  EXPECT_EQ(recovered[0].verdict(), v1::GuardEvent::VERDICT_TRANSIENT);
  EXPECT_EQ(recovered[0].documents_skipped(), 0);
  EXPECT_THAT(recovered[0].message(), HasSubstr("transient"));
  EXPECT_EQ(recovered[1].step(), 6);
  EXPECT_THAT(recovered[1].message(), HasSubstr("non-finite loss"));
  EXPECT_EQ(observer.Of(v1::GuardEvent::KIND_SKIP).size(), 0u);
  EXPECT_EQ(observer.Of(v1::GuardEvent::KIND_ROLLBACK).size(), 0u);
  for (const nlohmann::json& line : MetricsLines()) {
    EXPECT_EQ(line["skipped"], false);
    EXPECT_TRUE(line["loss"].is_number());
  }
  EXPECT_EQ(t->optimizer().steps(), 12);
}

TEST_F(GuardRecoveryTest, APoisonedDocumentIsDeterministicAndItsStepIsSkipped) {
  // A token whose embedding is NaN, in one document (line 21, read by step
  // 6): the step is as bad when re-run, and the event names the document.
  WriteData({21});
  RecordingObserver observer;
  std::unique_ptr<Trainer> t = Create(Spec(), &observer);
  ASSERT_NE(t, nullptr);
  PlantNaN(t->params().get("model.embed_tokens.weight")[kPoisonToken]);
  ASSERT_TRUE(t->Run().ok());
  const std::vector<v1::GuardEvent> skips = observer.Of(v1::GuardEvent::KIND_SKIP);
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_EQ(skips[0].step(), 6);
  EXPECT_EQ(skips[0].verdict(), v1::GuardEvent::VERDICT_DETERMINISTIC);
  EXPECT_THAT(skips[0].document_ids(), Contains(21));
  EXPECT_EQ(skips[0].first_document(), 20);
  EXPECT_EQ(skips[0].documents_skipped(), 4);
  EXPECT_EQ(observer.Of(v1::GuardEvent::KIND_ROLLBACK).size(), 0u);
  ExpectFiniteAdapter();
}

TEST_F(GuardRecoveryTest, ASpikeIsRolledBackPastItsDataWindow) {
  RecordingObserver observer;
  v1::JobSpec spec = Spec(
      "{snapshot_every: 2, good_after_steps: 2, spike_window: 8, loss_spike_zscore: 20,\n"
      " inject: {spike_at_step: [10]}}");
  spec.set_max_steps(14);
  std::unique_ptr<Trainer> t = Create(spec, &observer);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());
  const std::vector<v1::GuardEvent> rollbacks = observer.Of(v1::GuardEvent::KIND_ROLLBACK);
  ASSERT_EQ(rollbacks.size(), 1u);
  const v1::GuardEvent& r = rollbacks[0];
  EXPECT_EQ(r.trigger(), "spike");
  EXPECT_EQ(r.verdict(), v1::GuardEvent::VERDICT_DETERMINISTIC);
  EXPECT_EQ(r.step(), 10);
  // Snapshots of steps 6 and 8 are in the ring; only 6 had 2 clean steps
  // after it.
  EXPECT_EQ(r.to_step(), 6);
  EXPECT_EQ(r.first_document(), 24);
  EXPECT_EQ(r.documents_skipped(), 16);
  EXPECT_THAT(r.message(), HasSubstr("loss spike"));
  ASSERT_TRUE(r.has_loss());
  EXPECT_GT(r.loss(), 100);
  EXPECT_EQ(MetricsLines().size(), 14u);
}

TEST_F(GuardRecoveryTest, NaNWeightsSpendTheBudgetAndFailWithADiagnosis) {
  RecordingObserver observer;
  std::unique_ptr<Trainer> t =
      Create(Spec("{max_consecutive_bad: 2, max_rollbacks: 1}"), &observer);
  ASSERT_NE(t, nullptr);
  PlantNaN(t->params().get("model.layers.0.self_attn.q_proj.weight"));
  const absl::Status s = t->Run();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // Step, rank, module, verdict and documents, as a user acts on them.
  EXPECT_THAT(s.message(), HasSubstr("guard: step 2: non-finite"));
  EXPECT_THAT(s.message(), HasSubstr("rollback budget (1) is spent"));
  EXPECT_THAT(s.message(), HasSubstr("first non-finite gradient: model.layers.0."));
  EXPECT_THAT(s.message(), HasSubstr("on rank 0"));
  EXPECT_THAT(s.message(), HasSubstr("deterministic"));
  EXPECT_THAT(s.message(), HasSubstr("documents (lines of " + data_));
  const std::vector<v1::GuardEvent> diagnoses = observer.Of(v1::GuardEvent::KIND_DIAGNOSIS);
  ASSERT_EQ(diagnoses.size(), 1u);
  EXPECT_EQ(diagnoses[0].message(), s.message());
  EXPECT_EQ(observer.Of(v1::GuardEvent::KIND_ROLLBACK).size(), 1u);
  EXPECT_FALSE(fs::exists(fs::path(out()) / "adapter"));
}

TEST_F(GuardRecoveryTest, ANonFiniteCheckpointIsRefusedAndResumeTakesThePreviousGoodOne) {
  RecordingObserver observer;
  // A NaN written into a weight after step 6's update; checkpoints every 3
  // steps. Stop after step 7, which meets the NaN.
  observer.stop_after = 7;
  v1::JobSpec spec =
      Spec("{snapshot_every: 2, good_after_steps: 2, inject: {nan_weight_at_step: [6]}}");
  spec.set_checkpoint_every(3);
  {
    std::unique_ptr<Trainer> t = Create(spec, &observer);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->Run().code(), absl::StatusCode::kCancelled);
  }
  const std::vector<v1::GuardEvent> refused = observer.Of(v1::GuardEvent::KIND_CHECKPOINT_REFUSED);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused[0].step(), 6);
  EXPECT_THAT(refused[0].message(), HasSubstr("is not finite"));
  const std::string checkpoints = (fs::path(out()) / "checkpoints").string();
  EXPECT_FALSE(fs::exists(fs::path(checkpoints) / "step-00000006"));
  ASSERT_TRUE(fs::exists(fs::path(checkpoints) / "step-00000003"));
  EXPECT_TRUE(IsGoodCheckpoint((fs::path(checkpoints) / "step-00000003").string()));
  // Step 7 ran on the NaN weight and was skipped.
  ASSERT_EQ(observer.steps.size(), 7u);
  EXPECT_TRUE(observer.steps[6].skipped());

  EXPECT_EQ(FirstStepOfAResume(spec), 4);
}

TEST_F(GuardRecoveryTest, ACheckpointIsGoodOnlyAfterCleanStepsFollowIt) {
  RecordingObserver observer;
  observer.stop_after = 4;
  v1::JobSpec spec = Spec("{good_after_steps: 3}");
  spec.set_checkpoint_every(2);
  {
    std::unique_ptr<Trainer> t = Create(spec, &observer);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->Run().code(), absl::StatusCode::kCancelled);
  }
  // Step 2's checkpoint has 2 clean steps after it, not 3: a restart passes
  // it by and starts over.
  const fs::path step2 = fs::path(out()) / "checkpoints" / "step-00000002";
  ASSERT_TRUE(fs::exists(step2));
  EXPECT_FALSE(IsGoodCheckpoint(step2.string()));
  EXPECT_EQ(FirstStepOfAResume(spec), 1);
}

TEST_F(GuardRecoveryTest, StepsWithoutSupervisedTokensAreReportedAsSuchNeverAsALossOfZero) {
  RecordingObserver observer;
  std::unique_ptr<Trainer> t = Create(Spec("{inject: {zero_tokens_at_steps: [4, 5]}}"), &observer);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());
  const std::vector<v1::GuardEvent> skips = observer.Of(v1::GuardEvent::KIND_SKIP);
  ASSERT_EQ(skips.size(), 2u);
  EXPECT_EQ(skips[0].trigger(), "no_supervision");
  EXPECT_EQ(skips[0].verdict(), v1::GuardEvent::VERDICT_NOT_RERUN);
  const std::vector<nlohmann::json> lines = MetricsLines();
  ASSERT_EQ(lines.size(), 12u);
  EXPECT_TRUE(lines[3]["loss"].is_null());
  EXPECT_EQ(lines[3]["supervised_tokens"], 0);
  EXPECT_EQ(lines[3]["skipped"], true);
  EXPECT_FALSE(observer.steps[3].has_loss());
}

TEST_F(GuardRecoveryTest, NonFiniteBaseWeightsAreRefusedAtLoadNamingTheTensorAndElement) {
  // A NaN in an attention weight, an infinity in a token's embedding: either
  // would make every step that meets it non-finite.
  const std::string q_proj = "model.layers.0.self_attn.q_proj.weight";
  absl::Status s = CreateOnModelWith(q_proj, 5, 3, std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("model.path ", model_, ": tensor ", q_proj,
                                     " holds nan at "
                                     "flat index ",
                                     5 * TinyModel::kHidden + 3, " (element [5, 3])")));
  s = CreateOnModelWith("model.embed_tokens.weight", 7, 2, -std::numeric_limits<float>::infinity());
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("tensor model.embed_tokens.weight holds -inf at flat index ",
                                     7 * TinyModel::kHidden + 2, " (element [7, 2])")));
  EXPECT_FALSE(fs::exists(fs::path(out()) / "metrics.jsonl"));
}

TEST_F(GuardRecoveryTest, ARunWhoseLabelsAreAllMaskedFailsAndExportsNothing) {
  // Two steps: fewer than max_consecutive_bad, so the bad streak never rolls
  // back, and every step is skipped.
  WriteData({}, /*masked=*/true);
  RecordingObserver observer;
  v1::JobSpec spec = Spec();
  spec.set_max_steps(2);
  std::unique_ptr<Trainer> t = Create(spec, &observer);
  ASSERT_NE(t, nullptr);
  const absl::Status s = t->Run();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(s.message(),
            "guard: step 2: no step was applied: every step had no supervised tokens; the "
            "trained weights are not exported");
  const std::vector<v1::GuardEvent> diagnoses = observer.Of(v1::GuardEvent::KIND_DIAGNOSIS);
  ASSERT_EQ(diagnoses.size(), 1u);
  EXPECT_EQ(diagnoses[0].trigger(), "no_supervision");
  EXPECT_EQ(diagnoses[0].message(), s.message());
  EXPECT_FALSE(fs::exists(fs::path(out()) / "adapter"));
  EXPECT_FALSE(fs::exists(fs::path(out()) / "checkpoints" / "step-00000002"));
}

TEST_F(GuardRecoveryTest, ARunBelowTheMinimumAppliedFractionFails) {
  // 7 of 12 steps without supervision, never rolled back: 5 applied, fewer
  // than half. A quarter is enough.
  const std::string guard =
      "{max_consecutive_bad: 0, inject: {zero_tokens_at_steps: [2, 3, 5, 6, "
      "8, 9, 11]}";
  RecordingObserver observer;
  std::unique_ptr<Trainer> t = Create(Spec(guard + "}"), &observer);
  ASSERT_NE(t, nullptr);
  const absl::Status s = t->Run();
  ASSERT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("guard: step 12: only 5 of 12 steps were applied, fewer "
                                     "than guard.min_applied_fraction (0.5) of them: every "
                                     "skipped step had no supervised tokens"));
  EXPECT_EQ(t->optimizer().steps(), 5);
  EXPECT_FALSE(fs::exists(fs::path(out()) / "adapter"));

  ASSERT_TRUE(RemoveTree(out()).ok());
  t = Create(Spec(guard + ", min_applied_fraction: 0.25}"), &observer);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());
  ExpectFiniteAdapter();
}

TEST_F(GuardRecoveryTest, AppliedStepsCountOverTheJobAcrossAResume) {
  // Steps 7 to 12 have no supervision. The first attempt stops after step 7,
  // with a checkpoint of step 6; the second resumes there and applies none
  // of the 6 it runs. Over the job, 6 of 12 were applied: enough, as for a
  // run that never stopped.
  v1::JobSpec spec = Spec(
      "{max_consecutive_bad: 0, good_after_steps: 0, inject: {zero_tokens_at_steps: [7, 8, "
      "9, 10, 11, 12]}}");
  spec.set_checkpoint_every(6);
  {
    RecordingObserver first;
    first.stop_after = 7;
    std::unique_ptr<Trainer> t = Create(spec, &first);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(t->Run().code(), absl::StatusCode::kCancelled);
  }
  RecordingObserver second;
  std::unique_ptr<Trainer> t = Create(spec, &second);
  ASSERT_NE(t, nullptr);
  const absl::Status s = t->Run();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(second.steps.size(), 6u);
  EXPECT_EQ(second.steps[0].step(), 7);
  for (const v1::StepMetrics& m : second.steps) EXPECT_TRUE(m.skipped()) << m.step();
  EXPECT_EQ(t->optimizer().steps(), 6);
  ExpectFiniteAdapter();
}

}  // namespace
}  // namespace ballast::train
