#include "worker/train/trainer/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/model_config.h"
#include "tests/unit/train/tiny_model.h"
#include "tests/unit/train/trainer_reports.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/objective/causal_lm.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "trainer_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/11);
    data_ = WriteTokenData((fs::path(dir_) / "data.jsonl").string(), 32, /*seed=*/12);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  // A LoRA job on the tiny model.
  v1::JobSpec Spec() const {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(
        "model: {path: " + model_ + "}\n" + "data: {path: " + data_ +
        ", seq_len: 16, micro_batch_size: 2, grad_accum_steps: 2, shuffle: false}\n"
        "lora: {r: 4, target_modules: [q_proj, v_proj, down_proj]}\n"
        "optimizer: {lr: 0.01}\nmax_steps: 4\n");
    EXPECT_TRUE(spec.ok()) << spec.status();
    ApplyDefaults(&*spec);
    return *spec;
  }

  // An absurd learning rate: the first update (Adam's is about lr per
  // element) makes the activations overflow, so later steps' loss and
  // gradient are not finite.
  v1::JobSpec ExplodingFullFinetune() const {
    v1::JobSpec spec = Spec();
    spec.set_method("full");
    spec.mutable_optimizer()->set_lr(1e30);
    spec.mutable_optimizer()->set_max_grad_norm(0);
    return spec;
  }

  std::unique_ptr<Trainer> Create(const v1::JobSpec& spec, TrainerOptions options = {}) const {
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(spec, out(), options);
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? *std::move(t) : nullptr;
  }

  std::string out() const { return (fs::path(dir_) / "run").string(); }

  std::vector<nlohmann::json> MetricsLines() const { return ReadMetricsLines(out()); }

  std::map<std::string, at::Tensor> TrainableCopy(const Trainer& t) const {
    std::map<std::string, at::Tensor> copy;
    for (const std::string& n : t.params().TrainableNames()) {
      copy[n] = t.params().get(n).detach().clone();
    }
    return copy;
  }

  bool Unchanged(const Trainer& t, const std::map<std::string, at::Tensor>& before) const {
    for (const auto& [name, value] : before) {
      if (!torch::equal(t.params().get(name), value)) return false;
    }
    return true;
  }

  std::string dir_, model_, data_;
};

TEST_F(TrainerTest, StepAppliesAnUpdateAndAdvancesTheStepAndTheCursor) {
  std::unique_ptr<Trainer> t = Create(Spec());
  ASSERT_NE(t, nullptr);
  const auto before = TrainableCopy(*t);
  TrainPosition pos;
  GuardVerdict verdict;
  v1::StepMetrics r = t->Step(&pos, &verdict);

  EXPECT_EQ(pos.step, 1);
  EXPECT_EQ(pos.data_cursor, 4);  // micro_batch_size 2 x grad_accum_steps 2
  EXPECT_EQ(r.step(), 1);
  EXPECT_EQ(verdict.action, GuardAction::kApply);
  EXPECT_FALSE(r.skipped());
  ASSERT_TRUE(r.has_loss());
  EXPECT_TRUE(std::isfinite(r.loss()));
  EXPECT_GT(r.grad_norm(), 0);
  EXPECT_GT(r.supervised_tokens(), 0);
  EXPECT_LT(r.supervised_tokens(), r.tokens());  // each document's last token has no target
  EXPECT_FALSE(Unchanged(*t, before));
  EXPECT_EQ(t->optimizer().steps(), 1);
  for (const std::string& n : t->params().TrainableNames()) {
    EXPECT_FALSE(t->params().get(n).grad().defined()) << n << " keeps a gradient";
  }
}

TEST_F(TrainerTest, StepLossIsTheSumOverItsMicroBatchesDividedByTheStepsSupervisedTokens) {
  const v1::JobSpec spec = Spec();
  std::unique_ptr<Trainer> t = Create(spec);
  ASSERT_NE(t, nullptr);

  // The reference: the same two micro-batches through a decoder over the same
  // weights, summed, over the count of both (never a mean of per-batch means).
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_);
  ASSERT_TRUE(config.ok());
  absl::StatusOr<TokenizedDataset> data = TokenizedDataset::Load(data_, TinyModel::kVocab, 16);
  ASSERT_TRUE(data.ok());
  Decoder decoder(*config, &t->params(), LoraConfigFromSpec(spec.lora()), torch::kFloat, false);
  double sum = 0;
  int64_t count = 0;
  {
    torch::NoGradGuard no_grad;
    for (int64_t cursor : {0, 2}) {
      kernels::LossSum ls = CausalLm().Loss(decoder, data->Pack(cursor, 2), false);
      sum += ls.sum.item<double>();
      count += ls.count.item<int64_t>();
    }
  }
  TrainPosition pos;
  GuardVerdict verdict;
  v1::StepMetrics r = t->Step(&pos, &verdict);
  EXPECT_EQ(r.supervised_tokens(), count);
  ASSERT_TRUE(r.has_loss());
  // fp32 sums of a few dozen tokens: agreement to 1e-5 relative.
  EXPECT_NEAR(r.loss(), sum / count, 1e-5 * std::abs(sum / count));
}

TEST_F(TrainerTest, StepWithoutSupervisedTokensIsSkippedAndHasNoLoss) {
  WriteTokenData(data_, 8, /*seed=*/13, /*unsupervised_every=*/1);
  std::unique_ptr<Trainer> t = Create(Spec());
  ASSERT_NE(t, nullptr);
  const auto before = TrainableCopy(*t);
  TrainPosition pos;
  GuardVerdict verdict;
  v1::StepMetrics r = t->Step(&pos, &verdict);
  EXPECT_EQ(verdict.action, GuardAction::kSkip);
  EXPECT_TRUE(r.skipped());
  EXPECT_EQ(verdict.reason, "no supervised tokens");
  EXPECT_FALSE(r.has_loss());
  EXPECT_EQ(r.supervised_tokens(), 0);
  EXPECT_GT(r.tokens(), 0);
  EXPECT_EQ(pos.step, 1);  // the step counts: its batch is not retried
  EXPECT_TRUE(Unchanged(*t, before));
}

TEST_F(TrainerTest, ANonFiniteStepNeverReachesTheWeights) {
  std::unique_ptr<Trainer> t = Create(ExplodingFullFinetune());
  ASSERT_NE(t, nullptr);
  TrainPosition pos;
  GuardVerdict verdict;
  t->Step(&pos, &verdict);
  ASSERT_EQ(verdict.action, GuardAction::kApply);
  const auto before = TrainableCopy(*t);
  v1::StepMetrics r = t->Step(&pos, &verdict);
  EXPECT_EQ(verdict.action, GuardAction::kSkip);
  EXPECT_TRUE(r.skipped());
  EXPECT_THAT(verdict.reason, HasSubstr("non-finite"));
  EXPECT_TRUE(Unchanged(*t, before));
  EXPECT_EQ(t->optimizer().steps(), 1);
}

TEST_F(TrainerTest, RollsBackAfterABadStreakAndFailsWithADiagnosisWhenTheBudgetIsSpent) {
  RecordingObserver observer;
  TrainerOptions options;
  options.observer = &observer;
  v1::JobSpec spec = ExplodingFullFinetune();
  spec.mutable_guard()->set_max_consecutive_bad(2);
  spec.mutable_guard()->set_max_rollbacks(1);
  spec.set_max_steps(20);
  spec.set_checkpoint_every(1);
  std::unique_ptr<Trainer> t = Create(spec, options);
  ASSERT_NE(t, nullptr);
  const absl::Status s = t->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("rollback budget (1) is spent"));

  std::vector<v1::GuardEvent::Kind> kinds;
  for (const v1::GuardEvent& e : observer.guards) kinds.push_back(e.kind());
  EXPECT_THAT(kinds,
              ::testing::ElementsAre(v1::GuardEvent::KIND_SKIP, v1::GuardEvent::KIND_ROLLBACK,
                                     v1::GuardEvent::KIND_SKIP, v1::GuardEvent::KIND_DIAGNOSIS));
  const v1::GuardEvent& rollback = observer.guards[1];
  EXPECT_LT(rollback.to_step(), rollback.step());
  // The log agrees with what was rolled back: each step once, in order.
  int64_t last = 0;
  for (const nlohmann::json& line : MetricsLines()) {
    EXPECT_EQ(line["step"].get<int64_t>(), last + 1);
    last = line["step"].get<int64_t>();
  }
  EXPECT_FALSE(fs::exists(fs::path(out()) / "model"));
}

TEST_F(TrainerTest, RunLogsNullLossForAStepWithoutSupervisedTokensAndExportsTheAdapter) {
  WriteTokenData(data_, 8, /*seed=*/14, /*unsupervised_every=*/2);
  v1::JobSpec spec = Spec();
  spec.mutable_data()->set_micro_batch_size(1);
  spec.mutable_data()->set_grad_accum_steps(1);
  spec.set_max_steps(2);
  std::unique_ptr<Trainer> t = Create(spec);
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->Run().ok());
  std::vector<nlohmann::json> lines = MetricsLines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0]["loss"].is_null());  // document 0 has no supervised label
  EXPECT_EQ(lines[0]["skipped"], true);
  EXPECT_TRUE(lines[1]["loss"].is_number());
  EXPECT_EQ(lines[1]["skipped"], false);
  EXPECT_TRUE(fs::exists(fs::path(out()) / "adapter" / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(out()) / "checkpoints" / "step-00000002"));
}

TEST_F(TrainerTest, DataWithoutASupervisedLabelFailsWithADiagnosisInsteadOfExporting) {
  // Every label -100: before the guard counted such steps as bad, every step
  // was skipped, the run exited 0 and exported an adapter that had never
  // trained.
  WriteTokenData(data_, 8, /*seed=*/15, /*unsupervised_every=*/1);
  RecordingObserver observer;
  TrainerOptions options;
  options.observer = &observer;
  v1::JobSpec spec = Spec();
  spec.set_max_steps(10);
  std::unique_ptr<Trainer> t = Create(spec, options);
  ASSERT_NE(t, nullptr);
  const absl::Status s = t->Run();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("guard: step 3: no supervised tokens; 3 bad steps in a row"));
  ASSERT_FALSE(observer.guards.empty());
  EXPECT_EQ(observer.guards.back().kind(), v1::GuardEvent::KIND_DIAGNOSIS);
  EXPECT_FALSE(fs::exists(fs::path(out()) / "adapter"));
}

TEST_F(TrainerTest, ARollbackSkipsTheDataThatLedToIt) {
  RecordingObserver observer;
  TrainerOptions options;
  options.observer = &observer;
  v1::JobSpec spec = ExplodingFullFinetune();
  spec.set_max_steps(6);
  spec.set_checkpoint_every(1);
  spec.mutable_guard()->set_max_consecutive_bad(2);
  spec.mutable_guard()->set_max_rollbacks(1);
  std::unique_ptr<Trainer> t = Create(spec, options);
  ASSERT_NE(t, nullptr);
  t->Run().IgnoreError();
  const v1::GuardEvent* rollback = nullptr;
  for (const v1::GuardEvent& e : observer.guards) {
    if (e.kind() == v1::GuardEvent::KIND_ROLLBACK) rollback = &e;
  }
  ASSERT_NE(rollback, nullptr);
  // Every step since the checkpoint read 4 documents (micro-batches of 2, 2
  // per step); the run goes on after them.
  EXPECT_GT(rollback->step(), rollback->to_step());
  EXPECT_THAT(rollback->message(),
              HasSubstr(absl::StrCat("skipping the ", 4 * (rollback->step() - rollback->to_step()),
                                     " documents read since it")));
}

TEST_F(TrainerTest, RunStopsAtAStepBoundaryWhenTheObserverAsks) {
  RecordingObserver observer;
  observer.stop_after = 2;
  TrainerOptions options;
  options.observer = &observer;
  std::unique_ptr<Trainer> t = Create(Spec(), options);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->Run().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(observer.steps.size(), 2u);
  EXPECT_EQ(MetricsLines().size(), 2u);
  EXPECT_FALSE(fs::exists(fs::path(out()) / "adapter"));
}

TEST_F(TrainerTest, CreateRefusesADeviceOtherThanTheCpuOrAGpu) {
  TrainerOptions options;
  options.device = c10::Device(c10::kMeta);
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(Spec(), out(), options);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("device meta: the trainer runs on cpu or cuda"));
}

TEST_F(TrainerTest, CreateRefusesAnUnknownTask) {
  v1::JobSpec spec = Spec();
  spec.set_task("world_model");
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(spec, out());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(t.status().message(), HasSubstr("task = 'world_model'"));
}

TEST_F(TrainerTest, CreateReportsACorruptWeightsFileAsDataLoss) {
  fs::resize_file(fs::path(model_) / "model.safetensors", 100);
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(Spec(), out());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("model.safetensors"));
}

TEST_F(TrainerTest, CreateReportsATensorOfTheWrongShapeAsFailedPrecondition) {
  std::string config;
  {
    std::ifstream in(fs::path(model_) / "config.json");
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string from = "\"intermediate_size\": 48", to = "\"intermediate_size\": 40";
  ASSERT_NE(config.find(from), std::string::npos);
  config.replace(config.find(from), from.size(), to);
  std::ofstream(fs::path(model_) / "config.json") << config;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(Spec(), out());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition) << t.status();
  EXPECT_THAT(t.status().message(), HasSubstr("mlp.gate_proj.weight has shape"));
}

}  // namespace
}  // namespace ballast::train
