#include "common/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ballast {
namespace {

using ::testing::HasSubstr;

constexpr char kValid[] = R"(
name: demo
model: {path: /models/qwen3}
method: lora
lora: {r: 16, lora_alpha: 32, target_modules: [all-linear]}
data: {path: data.jsonl, seq_len: 512, micro_batch_size: 2, grad_accum_steps: 4}
optimizer: {lr: 2.0e-4, weight_decay: 0.01}
schedule: {kind: cosine, warmup_steps: 10}
max_steps: 100
checkpoint_every: 25
)";

absl::StatusOr<v1::JobSpec> ParseValidated(const std::string& text) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(text);
  if (!spec.ok()) return spec;
  ApplyDefaults(&*spec);
  if (absl::Status s = ValidateJobSpec(*spec); !s.ok()) return s;
  return spec;
}

TEST(JobSpec, ParsesEveryKeyOfAValidSpec) {
  absl::StatusOr<v1::JobSpec> spec = ParseValidated(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->lora().r(), 16);
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 2e-4);
  EXPECT_EQ(spec->data().grad_accum_steps(), 4);
  EXPECT_EQ(spec->schedule().kind(), "cosine");
  EXPECT_EQ(spec->checkpoint_every(), 25);
}

TEST(JobSpec, DefaultsFollowTheProtoComments) {
  absl::StatusOr<v1::JobSpec> spec = ParseValidated(
      "model: {path: m}\ndata: {path: d, seq_len: 8}\noptimizer: {lr: 0.1}\nmax_steps: 3\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->method(), "lora");
  EXPECT_EQ(spec->task(), "causal_lm");
  EXPECT_EQ(spec->lora().r(), 8);
  EXPECT_DOUBLE_EQ(spec->lora().lora_alpha(), 16);
  EXPECT_THAT(spec->lora().target_modules(), ::testing::ElementsAre("q_proj", "v_proj"));
  EXPECT_DOUBLE_EQ(spec->optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(spec->optimizer().max_grad_norm(), 1.0);
  EXPECT_TRUE(spec->data().shuffle());
  // The guard is on, and injects nothing.
  EXPECT_EQ(spec->guard().max_consecutive_bad(), 3);
  EXPECT_EQ(spec->guard().snapshot_every(), 10);
  EXPECT_EQ(spec->guard().snapshots(), 2);
  EXPECT_EQ(spec->guard().good_after_steps(), 10);
  EXPECT_TRUE(spec->guard().rerun_bad_step());
  EXPECT_DOUBLE_EQ(spec->guard().lr_cut(), 1);
  EXPECT_EQ(spec->guard().inject().ByteSizeLong(), 0u);
  // Reports go to metrics.jsonl and the job's events only.
  EXPECT_TRUE(spec->report_to().empty());
  // The watchdog is on; its fields have no presence, and 0 stands for the
  // default.
  EXPECT_DOUBLE_EQ(spec->watchdog().stall_factor(), 10);
  EXPECT_DOUBLE_EQ(spec->watchdog().stall_floor_s(), 120);
  EXPECT_DOUBLE_EQ(spec->watchdog().straggler_factor(), 2);
  EXPECT_EQ(spec->watchdog().straggler_window(), 20);
}

TEST(JobSpec, AWatchdogValueSetIsKeptAndItsZeroIsTheDefault) {
  absl::StatusOr<v1::JobSpec> spec = ParseValidated(
      "model: {path: m}\ndata: {path: d, seq_len: 8}\noptimizer: {lr: 0.1}\nmax_steps: 3\n"
      "watchdog: {stall_factor: 4, stall_floor_s: 1.5, straggler_factor: 0, "
      "straggler_window: 3}\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_DOUBLE_EQ(spec->watchdog().stall_factor(), 4);
  EXPECT_DOUBLE_EQ(spec->watchdog().stall_floor_s(), 1.5);
  EXPECT_DOUBLE_EQ(spec->watchdog().straggler_factor(), 2);
  EXPECT_EQ(spec->watchdog().straggler_window(), 3);
}

TEST(JobSpec, UnknownKeyIsNamedWithItsPath) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("lora: {rank: 8}\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(), HasSubstr("unknown key 'lora.rank'"));
  EXPECT_THAT(spec.status().message(), HasSubstr("lora_alpha"));
}

TEST(JobSpec, DuplicateKeysAndSecondDocumentsAreRefusedNotIgnored) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("max_steps: 3\nseed: 1\nmax_steps: 5\n");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("duplicate key 'max_steps' at line 3 (first at line 1)"));
  spec = ParseJobSpecYaml("data: {seq_len: 8, seq_len: 16}\n");
  EXPECT_THAT(spec.status().message(), HasSubstr("duplicate key 'data.seq_len' at line 1"));
  spec = ParseJobSpecYaml("max_steps: 3\n---\nmax_steps: 5\n");
  EXPECT_THAT(spec.status().message(),
              HasSubstr("spec holds 2 YAML documents (the second at line 3"));
  // A lone document marker is still one document.
  EXPECT_TRUE(ParseJobSpecYaml("---\nmax_steps: 3\n").ok());
}

TEST(JobSpec, AKeyThatIsNotAFieldNameIsRefusedWithItsPlace) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("schedule:\n  ? {kind: cosine}\n  : 1\n");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("schedule.<key>: expected a key that is a field name, got a mapping"));
}

TEST(JobSpec, IntegersWithALeadingZeroAreRefusedAsAmbiguous) {
  // YAML 1.1 (yaml-cpp alone, PyYAML) reads 010 as 8, YAML 1.2 as 10.
  for (const char* zero_led : {"max_steps: 010\n", "max_steps: -07\n", "max_steps: 00\n"}) {
    const absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(zero_led);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << zero_led;
    EXPECT_THAT(spec.status().message(), HasSubstr("max_steps: '"));
    EXPECT_THAT(spec.status().message(), HasSubstr("has a leading zero")) << zero_led;
  }
  v1::JobSpec overridden;
  EXPECT_THAT(ApplyOverrides({"data.seq_len=0100"}, &overridden).message(),
              HasSubstr("data.seq_len: '0100' has a leading zero"));
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("max_steps: 10\nseed: 0x1f\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_steps(), 10);
  EXPECT_EQ(spec->seed(), 31);
  EXPECT_EQ(ParseJobSpecYaml("max_steps: 0\n")->max_steps(), 0);
  EXPECT_EQ(ParseJobSpecYaml("max_steps: 0o17\n")->max_steps(), 15);
  EXPECT_EQ(ParseJobSpecYaml("max_steps: -4\n")->max_steps(), -4);
  for (const char* bad : {"max_steps: 1.5\n", "max_steps: 99999999999999999999\n",
                          "max_steps: 0x\n", "max_steps: 12ab\n"}) {
    EXPECT_THAT(ParseJobSpecYaml(bad).status().message(),
                HasSubstr("max_steps: expected an integer"))
        << bad;
  }
}

TEST(JobSpec, InvalidUtf8IsNamedAndNamesCountCharacters) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("name: \"caf\\xE9\"\n");
  ASSERT_TRUE(spec.ok()) << spec.status();  // \xE9 escaped in YAML is U+00E9, valid
  spec = ParseJobSpecYaml(std::string("name: ab\xff\n"));
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              HasSubstr("spec is not valid UTF-8 at line 1, column 9 (byte 8)"));
  // Anywhere: in a key, a comment, a later line.
  for (const std::string& bad :
       {std::string("max_steps: 3\nna\xc3me: x\n"), std::string("max_steps: 3\n# caf\xe9\n"),
        std::string("max_steps: 3\nname: \xed\xa0\x80\n")}) {
    spec = ParseJobSpecYaml(bad);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(spec.status().message(), HasSubstr("not valid UTF-8 at line 2, column "));
  }
  // And in a --set value, which is no file.
  v1::JobSpec overridden;
  EXPECT_THAT(ApplyOverrides({std::string("name=ab\xff")}, &overridden).message(),
              HasSubstr("name: not valid UTF-8 (at byte 2)"));
  // 100 Greek letters are 200 bytes and a valid name.
  std::string greek;
  for (int i = 0; i < 100; ++i) greek += "\xce\xb1";
  spec = ParseValidated(std::string(kValid) + "name: " + greek + "\n");
  EXPECT_THAT(spec.status().message(), HasSubstr("duplicate key 'name'"));
  absl::StatusOr<v1::JobSpec> base = ParseValidated(kValid);
  ASSERT_TRUE(base.ok());
  base->set_name(greek);
  EXPECT_TRUE(ValidateJobSpec(*base).ok()) << ValidateJobSpec(*base);
  base->set_name(greek + greek);
  EXPECT_THAT(ValidateJobSpec(*base).message(), HasSubstr("name = 200 characters"));
}

TEST(JobSpec, ANameWithControlCharactersIsRefused) {
  absl::StatusOr<v1::JobSpec> spec = ParseValidated(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const std::string& name :
       {std::string("x\x1b[2J"), std::string("a\njob-2  SUCCEEDED"), std::string("w-\xc2\x9b")}) {
    spec->set_name(name);
    const absl::Status s = ValidateJobSpec(*spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("name has a control character at byte "));
  }
  spec->set_name("caf\xc3\xa9 \xe2\x9c\x93");
  EXPECT_TRUE(ValidateJobSpec(*spec).ok());
}

TEST(JobSpec, LoraFieldsAreCheckedWhateverTheMethod) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);
  ASSERT_TRUE(spec.ok());
  spec->set_method("full");
  spec->mutable_lora()->set_lora_dropout(std::nan(""));
  ApplyDefaults(&*spec);
  EXPECT_THAT(ValidateJobSpec(*spec).message(), HasSubstr("lora.lora_dropout = nan"));
  spec->mutable_lora()->set_lora_dropout(0.1);
  EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
  // An adapter to start from would be ignored by a full finetune.
  spec->mutable_lora()->set_init_adapter("/adapters/a");
  EXPECT_THAT(ValidateJobSpec(*spec).message(),
              HasSubstr("lora.init_adapter is set, but method is full"));
}

TEST(JobSpec, AnOverrideKeyOfManyPartsIsRefusedAtOnce) {
  v1::JobSpec spec;
  std::string key = "a";
  for (int i = 0; i < 16000; ++i) key += ".a";
  const absl::Status s = ApplyOverrides({key + "=1"}, &spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("a key of 16001 parts; spec keys have at most 8"));
}

TEST(JobSpec, WrongTypeNamesFieldAndValue) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml("max_steps: lots\n");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(spec.status().message(), HasSubstr("max_steps: expected an integer, got 'lots'"));
}

TEST(JobSpec, OutOfRangeValuesNameFieldAndRange) {
  struct Case {
    const char* override_;
    const char* message;
  };
  for (const Case& c :
       {Case{"optimizer.lr=-1", "optimizer.lr = -1 is out of range; allowed: (0, 1]"},
        Case{"lora.r=0", "lora.r = 0 is out of range; allowed: 1..4096"},
        Case{"data.seq_len=0", "data.seq_len = 0"},
        Case{"lora.lora_dropout=1", "lora.lora_dropout = 1"},
        Case{"schedule.kind=step", "schedule.kind = 'step' is not supported"},
        Case{"lora.target_modules=[qkv]", "lora.target_modules = 'qkv'"},
        Case{"method=qlora", "method = 'qlora'"},
        Case{"task=reranker", "task = 'reranker'"},
        Case{"checkpoint_every=101", "checkpoint_every = 101"},
        Case{"devices=0", "devices = 0 is out of range; allowed: 1..1024"},
        Case{"devices=1025", "devices = 1025 is out of range; allowed: 1..1024"},
        Case{"guard.loss_spike_zscore=2", "guard.loss_spike_zscore = 2 is out of range"},
        Case{"guard.snapshots=0", "guard.snapshots = 0 is out of range; allowed: 1..16"},
        Case{"guard.lr_cut=0", "guard.lr_cut = 0 is out of range; allowed: (0, 1]"},
        Case{"guard.inject.nan_grad_at_step=[5, 101]",
             "guard.inject.nan_grad_at_step = 101 is out of range; allowed: 1..max_steps"},
        Case{"guard.inject.zero_tokens_at_steps=[0]", "guard.inject.zero_tokens_at_steps = 0"},
        Case{"guard.inject.on_rank=1",
             "guard.inject.on_rank = 1 is out of range; allowed: 0..devices-1"},
        Case{"keep_checkpoints=-1", "keep_checkpoints = -1"},
        Case{"report_to=[tensorboard, wandb]",
             "report_to = 'wandb' is not supported; allowed: tensorboard"},
        Case{"guard.moe_collapse_share=0.3",
             "guard.moe_collapse_share = 0.3 is out of range; allowed: 0 (off) or [0.5, 1)"},
        Case{"moe.aux_loss=per_step", "moe.aux_loss = 'per_step' is not supported"},
        Case{"moe.aux_loss_scope=mean", "moe.aux_loss_scope = 'mean'"},
        Case{"moe.router_aux_loss_coef=-0.1", "moe.router_aux_loss_coef = -0.1"},
        Case{"moe.balance=sinkhorn",
             "moe.balance = 'sinkhorn' is not supported; allowed: aux_free, aux_loss"},
        Case{"watchdog.stall_factor=1", "watchdog.stall_factor = 1 is out of range; allowed: (1, "},
        Case{"watchdog.stall_factor=-3", "watchdog.stall_factor = -3 is out of range"},
        Case{"watchdog.stall_floor_s=-1",
             "watchdog.stall_floor_s = -1 is out of range; allowed: [1, "},
        Case{"watchdog.stall_floor_s=0.5", "watchdog.stall_floor_s = 0.5 is out of range"},
        Case{"watchdog.straggler_factor=0.9", "watchdog.straggler_factor = 0.9 is out of range"},
        Case{"watchdog.straggler_window=-2",
             "watchdog.straggler_window = -2 is out of range; allowed: 1..100000"}}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);
    ASSERT_TRUE(spec.ok());
    ASSERT_TRUE(ApplyOverrides({c.override_}, &*spec).ok()) << c.override_;
    ApplyDefaults(&*spec);
    absl::Status s = ValidateJobSpec(*spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.override_;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.override_;
  }
}

// The moe section's defaults fill a spec that has the section (PrepareJobSpec
// gives one to a model with experts), and only such a spec: a dense model's
// spec stays without one. router_aux_loss_coef stays config.json's.
TEST(JobSpec, MoeDefaultsFillOnlyASpecWithAMoeSection) {
  absl::StatusOr<v1::JobSpec> dense = ParseValidated(kValid);
  ASSERT_TRUE(dense.ok()) << dense.status();
  EXPECT_FALSE(dense->has_moe());
  EXPECT_DOUBLE_EQ(dense->guard().moe_collapse_share(), 0.9);

  absl::StatusOr<v1::JobSpec> moe = ParseValidated(absl::StrCat(kValid, "moe: {}\n"));
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->moe().aux_loss(), "global");
  EXPECT_EQ(moe->moe().aux_loss_scope(), "all_layers");
  EXPECT_FALSE(moe->moe().has_router_aux_loss_coef());
  EXPECT_EQ(moe->moe().balance(), "aux_loss");
  EXPECT_FALSE(moe->moe().has_aux_free_rate());
}

// moe.aux_free_rate: aux_free's alone, and a positive finite step of at
// most 1 (the bias moves against probabilities); the errors name the key.
TEST(JobSpec, AuxFreeRateIsCheckedAndOnlyForBalanceAuxFree) {
  struct Case {
    std::vector<std::string> overrides;
    const char* message;  // empty: valid
  };
  for (const Case& c :
       {Case{{"moe.balance=aux_free"}, ""},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=0.5"}, ""},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=1"}, ""},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=0"},
             "moe.aux_free_rate = 0 is out of range; allowed: (0, 1], with balance aux_free"},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=-0.001"}, "moe.aux_free_rate = -0.001"},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=1.5"}, "moe.aux_free_rate = 1.5"},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=.nan"}, "moe.aux_free_rate = nan"},
        Case{{"moe.balance=aux_free", "moe.aux_free_rate=.inf"}, "moe.aux_free_rate = inf"},
        Case{{"moe.aux_free_rate=0.01"},
             "moe.aux_free_rate is set, but moe.balance is aux_loss; the rate is for "
             "moe.balance aux_free"},
        Case{{"moe.balance=aux_loss", "moe.aux_free_rate=0.01"},
             "moe.aux_free_rate is set, but moe.balance is aux_loss"}}) {
    const std::string name = absl::StrJoin(c.overrides, " ");
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);
    ASSERT_TRUE(spec.ok());
    ASSERT_TRUE(ApplyOverrides(c.overrides, &*spec).ok()) << name;
    ApplyDefaults(&*spec);
    const absl::Status s = ValidateJobSpec(*spec);
    if (std::string(c.message).empty()) {
      EXPECT_TRUE(s.ok()) << name << ": " << s;
      EXPECT_EQ(spec->moe().balance(), "aux_free") << name;
      EXPECT_EQ(spec->moe().has_aux_free_rate(), c.overrides.size() > 1) << "not filled: " << name;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << name;
  }
}

TEST(JobSpec, AGangOfUpTo1024DevicesIsValid) {
  for (const char* devices : {"devices=2", "devices=1024"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);
    ASSERT_TRUE(spec.ok());
    ASSERT_TRUE(ApplyOverrides({devices, "data.grad_accum_steps=1024"}, &*spec).ok()) << devices;
    ApplyDefaults(&*spec);
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << devices;
  }
}

TEST(JobSpec, AGangSplitsEachStepsMicroBatchesEvenly) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);  // grad_accum_steps 4
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(ApplyOverrides({"devices=3"}, &*spec).ok());
  ApplyDefaults(&*spec);
  absl::Status s = ValidateJobSpec(*spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.grad_accum_steps = 4 is not a multiple of devices 3"));
  ASSERT_TRUE(ApplyOverrides({"devices=2"}, &*spec).ok());
  EXPECT_TRUE(ValidateJobSpec(*spec).ok());
}

TEST(JobSpec, OverridesReplaceNestedValuesAndLists) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kValid);
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(
      ApplyOverrides({"optimizer.lr=1e-3", "lora.target_modules=[q_proj, k_proj]"}, &*spec).ok());
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-3);
  EXPECT_THAT(spec->lora().target_modules(), ::testing::ElementsAre("q_proj", "k_proj"));
  EXPECT_FALSE(ApplyOverrides({"no-equals-sign"}, &*spec).ok());
  EXPECT_FALSE(ApplyOverrides({"lora.bogus=1"}, &*spec).ok());
}

TEST(JobSpec, MalformedYamlAndMissingFileAreClearErrors) {
  EXPECT_THAT(ParseJobSpecYaml("model: [unclosed\n").status().message(),
              HasSubstr("not valid YAML"));
  absl::StatusOr<v1::JobSpec> missing = LoadJobSpecFile("/nonexistent/job.yaml");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/job.yaml"));
}

TEST(JobSpec, ASpecPastTheServicesLimitIsRefusedBeforeItIsParsed) {
  const std::filesystem::path file = std::filesystem::temp_directory_path() /
                                     absl::StrCat("ballast-huge-spec-", getpid(), ".yaml");
  {
    std::ofstream out(file);
    out << "guard:\n  inject:\n    zero_tokens_at_steps:\n";
    while (out.tellp() <= kMaxJobSpecBytes) out << "      - 1\n";
  }
  absl::StatusOr<v1::JobSpec> loaded = LoadJobSpecFile(file.string());
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr(absl::StrCat("at most ", kMaxJobSpecBytes)));
  std::filesystem::remove(file);

  // What reaches ballastd without the CLI is held to the same limit.
  absl::StatusOr<v1::JobSpec> spec = ParseValidated(kValid);
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_reranker()->set_instruction(std::string(kMaxJobSpecBytes, 'x'));
  const absl::Status s = ValidateJobSpec(*spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("at most ", kMaxJobSpecBytes, " are allowed")));
}

// yaml-cpp 0.7's LoadAll loops for ever on these, its memory growing; the
// fuzzer (tests/fuzz/corpus/job_spec) found the first.
TEST(JobSpec, YamlThatStallsTheParserIsRefusedNotLoopedOn) {
  for (const char* text : {",", "# comment\n, ,\n", "---\n,", "[a, b],"}) {
    absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(text);
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(spec.status().message(), HasSubstr("not valid YAML")) << text;
  }
}

TEST(JobSpec, ParsesProtoJsonAsProtobufWritesIt) {
  // int64 fields as strings and explicit zeros of optional fields, as
  // MessageToJsonString writes them for a worker's spec.json.
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecJson(R"({
    "model": {"path": "/m"}, "data": {"path": "/d", "seq_len": 64, "shuffle": false},
    "optimizer": {"lr": 0.001, "beta1": 0}, "maxSteps": "5000000000", "seed": "18446744073709551615"
  })");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_steps(), 5000000000);
  EXPECT_EQ(spec->seed(), 18446744073709551615ull);
  EXPECT_TRUE(spec->data().has_shuffle());
  EXPECT_FALSE(spec->data().shuffle());
  EXPECT_TRUE(spec->optimizer().has_beta1());
}

TEST(JobSpec, ProtoJsonRefusesUnknownFieldsAndMalformedText) {
  absl::StatusOr<v1::JobSpec> unknown = ParseJobSpecJson(R"({"lora": {"rank": 8}})");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("rank"));
  absl::StatusOr<v1::JobSpec> malformed = ParseJobSpecJson("{\"model\": ");
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(), HasSubstr("not valid JobSpec JSON"));
}

TEST(JobSpec, LoadsDotJsonFilesAsProtoJsonAndOthersAsYaml) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / absl::StrCat("ballast-spec-", getpid());
  std::filesystem::create_directories(dir);
  // Protobuf's JSON parser takes lowerCamelCase names; the YAML loader
  // takes the proto's own names only, so the same text tells them apart.
  const std::string text = R"({"maxSteps": 7})";
  std::ofstream(dir / "spec.json") << text;
  std::ofstream(dir / "spec.yaml") << text;
  absl::StatusOr<v1::JobSpec> json = LoadJobSpecFile((dir / "spec.json").string());
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->max_steps(), 7);
  absl::StatusOr<v1::JobSpec> yaml = LoadJobSpecFile((dir / "spec.yaml").string());
  EXPECT_EQ(yaml.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(yaml.status().message(), HasSubstr("unknown key 'maxSteps'"));
  EXPECT_THAT(yaml.status().message(), HasSubstr((dir / "spec.yaml").string()));
  std::filesystem::remove_all(dir);
}

TEST(JobSpec, EveryExampleSpecIsValid) {
  const char* root = std::getenv("BALLAST_SOURCE_DIR");
  ASSERT_NE(root, nullptr) << "run through ctest, which sets BALLAST_SOURCE_DIR";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(root) + "/examples")) {
    if (entry.path().extension() != ".yaml") continue;
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    ApplyDefaults(&*spec);
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << entry.path() << ": " << ValidateJobSpec(*spec);
    ++count;
  }
  EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace ballast
