#include "common/job_spec_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/model_types.h"

namespace ballast {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// A config.json whose shape the decoder can run: the shape keys, then `rest`.
std::string ConfigJson(absl::string_view rest) {
  return absl::StrCat(R"({"vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, )",
                      R"("num_hidden_layers": 2, "num_attention_heads": 4, )", rest, "}");
}

class JobSpecFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ballast-spec-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    fs::create_directories(dir_ / "model");
    WriteConfig(ConfigJson(R"("model_type": "llama", "max_position_embeddings": 1024)"));
    std::ofstream(dir_ / "data.jsonl") << "{\"input_ids\": [1]}\n";
    spec_.mutable_model()->set_path((dir_ / "model").string());
    spec_.mutable_data()->set_path((dir_ / "data.jsonl").string());
    spec_.mutable_data()->set_seq_len(1024);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void WriteConfig(const std::string& text) {
    std::ofstream(dir_ / "model" / "config.json") << text;
  }

  fs::path dir_;
  v1::JobSpec spec_;
};

TEST_F(JobSpecFilesTest, AcceptsASpecWhoseFilesExistAndFit) {
  EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok()) << ValidateJobSpecFiles(spec_);
}

TEST_F(JobSpecFilesTest, MissingConfigNamesModelPath) {
  fs::remove(dir_ / "model" / "config.json");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.path"));
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST_F(JobSpecFilesTest, AConfigThatIsHugeOrAFifoIsRefusedAtOnce) {
  WriteConfig(std::string(2 << 20, ' '));
  absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.path: "));
  EXPECT_THAT(s.message(), HasSubstr("is 2097152 bytes; at most 1048576"));
  fs::remove(dir_ / "model" / "config.json");
  ASSERT_EQ(mkfifo((dir_ / "model" / "config.json").c_str(), 0600), 0);
  s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config.json is a FIFO"));
}

TEST_F(JobSpecFilesTest, AWeightsFileThatIsAFifoIsRefusedAtSubmission) {
  std::ofstream(dir_ / "model" / "model-00001-of-00002.safetensors") << "x";
  ASSERT_EQ(mkfifo((dir_ / "model" / "model-00002-of-00002.safetensors").c_str(), 0600), 0);
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.path: "));
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors is a FIFO"));
}

TEST_F(JobSpecFilesTest, AnInitAdapterMustBeAPeftAdapterFolder) {
  const fs::path adapter = dir_ / "adapter";
  fs::create_directories(adapter);
  spec_.mutable_lora()->set_init_adapter(adapter.string());
  absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lora.init_adapter: "));
  EXPECT_THAT(s.message(), HasSubstr("adapter_config.json does not exist"));

  std::ofstream(adapter / "adapter_config.json") << R"({"r": 8, "lora_alpha": 16})";
  s = ValidateJobSpecFiles(spec_);
  EXPECT_THAT(s.message(), HasSubstr("adapter_model.safetensors does not exist"));
  ASSERT_EQ(mkfifo((adapter / "adapter_model.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(),
              HasSubstr("adapter_model.safetensors is a FIFO"));
  fs::remove(adapter / "adapter_model.safetensors");
  std::ofstream(adapter / "adapter_model.safetensors") << "x";
  EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok()) << ValidateJobSpecFiles(spec_);

  std::ofstream(adapter / "adapter_config.json") << "[1, 2]";
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(),
              HasSubstr("adapter_config.json is not valid JSON"));
}

TEST_F(JobSpecFilesTest, RelativePathsAreRefusedNamingTheField) {
  spec_.mutable_data()->set_path("data.jsonl");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.path: 'data.jsonl' is relative"));
}

TEST_F(JobSpecFilesTest, MalformedConfigIsInvalidArgument) {
  WriteConfig("{\"max_position_embeddings\": ");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
}

TEST_F(JobSpecFilesTest, MissingDataNamesDataPath) {
  spec_.mutable_data()->set_path((dir_ / "nope.jsonl").string());
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.path"));
}

// Issue 33: /proc/self/mem is "regular" to stat, and its read fails (EIO).
TEST_F(JobSpecFilesTest, DataThatIsNotAFileOnADiskIsRefusedNamingTheField) {
  for (const char* path : {"/proc/self/mem", "/proc/self/status"}) {
    spec_.mutable_data()->set_path(path);
    const absl::Status s = ValidateJobSpecFiles(spec_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(std::string("data.path: ") + path +
                                       " is a file of the kernel's proc file system"));
  }
  spec_.mutable_data()->set_path((dir_ / "data.jsonl").string());
  spec_.mutable_reranker()->set_eval_path(dir_.string());
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(),
              HasSubstr("reranker.eval_path: " + dir_.string() + " is a folder with no data"));
}

TEST_F(JobSpecFilesTest, AFolderOfShardsIsDataWhenEveryShardIsARegularFile) {
  fs::create_directories(dir_ / "shards");
  std::ofstream(dir_ / "shards" / "part-0.parquet") << "PAR1";
  spec_.mutable_data()->set_path((dir_ / "shards").string());
  EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok()) << ValidateJobSpecFiles(spec_);
  // A FIFO among the shards would hold a rank in open() for good.
  ASSERT_EQ(mkfifo((dir_ / "shards" / "part-1.parquet").c_str(), 0600), 0);
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.path: "));
  EXPECT_THAT(s.message(), HasSubstr("part-1.parquet"));
}

TEST_F(JobSpecFilesTest, SeqLenAboveMaxPositionEmbeddingsNamesTheRange) {
  spec_.mutable_data()->set_seq_len(1025);
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.seq_len = 1025 is out of range; allowed: 1..1024"));
  EXPECT_THAT(s.message(), HasSubstr((dir_ / "model" / "config.json").string()));
}

TEST_F(JobSpecFilesTest, AcceptsEverySupportedModelType) {
  spec_.mutable_block_diffusion()->set_block_length(4);
  for (absl::string_view model_type : kSupportedModelTypes) {
    // A vision-language wrapper keeps the decoder's keys in text_config.
    const std::string text_key(TextConfigKey(model_type));
    const std::string keys = ConfigJson(
        absl::StrCat(R"("model_type": ")",
                     text_key.empty() ? std::string(model_type) : absl::StrCat(model_type, "_text"),
                     R"(", "max_position_embeddings": 1024)"));
    WriteConfig(text_key.empty() ? keys
                                 : absl::StrCat(R"({"model_type": ")", model_type, R"(", ")",
                                                text_key, R"(": )", keys, "}"));
    // An SDAR checkpoint trains by block diffusion only (SdarCheckpointTest);
    // Qwen3.5's Gated DeltaNet layers cannot (below).
    spec_.set_task(absl::StartsWith(model_type, "qwen3_5") ? "causal_lm" : "block_diffusion");
    EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok())
        << model_type << ": " << ValidateJobSpecFiles(spec_);
  }
}

TEST_F(JobSpecFilesTest, Qwen35sSeqLenBoundIsInTextConfig) {
  WriteConfig(absl::StrCat(R"({"model_type": "qwen3_5", "text_config": )",
                           ConfigJson(R"("max_position_embeddings": 512)"), "}"));
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.seq_len = 1024 is out of range; allowed: 1..512 "
                                     "(text_config.max_position_embeddings in"));
}

TEST_F(JobSpecFilesTest, BlockDiffusionOnAGatedDeltaNetModelIsRefusedWithTheReason) {
  spec_.set_task("block_diffusion");
  spec_.mutable_block_diffusion()->set_block_length(4);
  WriteConfig(ConfigJson(R"("model_type": "qwen3_5_text", "max_position_embeddings": 1024)"));
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("task = 'block_diffusion'"));
  EXPECT_THAT(s.message(), HasSubstr("linear_attention (Gated DeltaNet)"));
  EXPECT_THAT(s.message(), HasSubstr("no defined meaning"));
  // Full-attention layers only: block diffusion is defined.
  WriteConfig(ConfigJson(R"("model_type": "qwen3_5_text", "max_position_embeddings": 1024, )"
                         R"("layer_types": ["full_attention", "full_attention"])"));
  EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok()) << ValidateJobSpecFiles(spec_);
}

// The trainer's parse of config.json runs at submission: what the decoder
// cannot run never waits in the queue.
TEST_F(JobSpecFilesTest, AConfigTheDecoderCannotRunIsRefusedAtSubmission) {
  const std::string config_name = (dir_ / "model" / "config.json").string();
  WriteConfig(ConfigJson(
      R"("model_type": "llama", "max_position_embeddings": 1024, "num_key_value_heads": 3)"));
  absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(config_name));
  EXPECT_THAT(s.message(), HasSubstr("num_key_value_heads must divide num_attention_heads (4)"));
  WriteConfig(ConfigJson(
      R"("model_type": "qwen3", "max_position_embeddings": 1024, "hidden_act": "gelu")"));
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(), HasSubstr("hidden_act must be \"silu\""));
  WriteConfig(R"({"model_type": "qwen3", "max_position_embeddings": 1024})");
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(), HasSubstr("vocab_size"));
}

TEST_F(JobSpecFilesTest, UnsupportedModelTypeNamesTheFileAndTheAllowedTypes) {
  WriteConfig(R"({"model_type": "mixtral", "max_position_embeddings": 1024})");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr((dir_ / "model" / "config.json").string()));
  EXPECT_THAT(s.message(), HasSubstr("model_type 'mixtral'"));
  EXPECT_THAT(s.message(), HasSubstr("allowed: llama, qwen2, qwen3, sdar"));
}

TEST_F(JobSpecFilesTest, MissingModelTypeNamesTheAllowedTypes) {
  WriteConfig(R"({"max_position_embeddings": 1024})");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no model_type"));
  EXPECT_THAT(s.message(), HasSubstr("allowed: llama, qwen2, qwen3, sdar"));
}

TEST_F(JobSpecFilesTest, ConfigWithoutMaxPositionEmbeddingsIsRefused) {
  WriteConfig(R"({"model_type": "qwen2", "max_position_embeddings": 0})");
  const absl::Status zero = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("max_position_embeddings, a positive integer"));
  WriteConfig(R"({"model_type": "qwen2"})");
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(), HasSubstr("max_position_embeddings"));
}

TEST_F(JobSpecFilesTest, PrepareFillsDefaultsThenChecksRangesBeforeFiles) {
  spec_.mutable_optimizer()->set_lr(1e-4);
  spec_.set_max_steps(10);
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.method(), "lora");
  EXPECT_EQ(spec_.lora().r(), 8);

  // Both a range and a file are wrong: the range is reported, as at submission.
  spec_.mutable_lora()->set_r(0);
  spec_.mutable_data()->set_path((dir_ / "nope.jsonl").string());
  const absl::Status s = PrepareJobSpec(&spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lora.r = 0 is out of range"));

  spec_.mutable_lora()->set_r(8);
  EXPECT_THAT(PrepareJobSpec(&spec_).message(), HasSubstr("data.path"));
}

// A moe section would be ignored on a dense model: refused, naming the keys
// the user wrote (not the ones the defaults would add), by PrepareJobSpec and
// by ValidateJobSpecFiles alike; a dense spec gets no moe section.
TEST_F(JobSpecFilesTest, AMoeSectionOnADenseModelIsRefusedNamingItsKeys) {
  spec_.mutable_optimizer()->set_lr(1e-4);
  spec_.set_max_steps(10);
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_FALSE(spec_.has_moe());

  spec_.mutable_moe()->set_aux_loss_scope("per_layer");
  const absl::Status s = PrepareJobSpec(&spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("moe.aux_loss_scope is set, but "));
  EXPECT_THAT(s.message(), HasSubstr("is a dense model (no num_experts)"));
  EXPECT_THAT(s.message(), Not(HasSubstr("moe.aux_loss,")));
  EXPECT_THAT(s.message(), Not(HasSubstr("moe.aux_loss ")));
  EXPECT_TRUE(spec_.moe().aux_loss().empty()) << "refused before the defaults";

  spec_.mutable_moe()->set_router_aux_loss_coef(0.01);
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(),
              HasSubstr("moe.aux_loss_scope, moe.router_aux_loss_coef are set, but "));
  spec_.mutable_moe()->Clear();
  spec_.mutable_moe()->set_balance("aux_free");
  spec_.mutable_moe()->set_aux_free_rate(0.01);
  EXPECT_THAT(PrepareJobSpec(&spec_).message(),
              HasSubstr("moe.balance, moe.aux_free_rate are set, but "));
  // `moe: {}` alone is a section too.
  spec_.mutable_moe()->Clear();
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(), HasSubstr("moe is set, but "));
}

// A model with experts gets the moe section and its defaults (global
// balancing), and a user's key stays.
TEST_F(JobSpecFilesTest, AModelWithExpertsGetsTheMoeSectionAndItsDefaults) {
  WriteConfig(ConfigJson(R"("model_type": "qwen3_moe", "max_position_embeddings": 1024, )"
                         R"("num_experts": 4, "num_experts_per_tok": 2, )"
                         R"("moe_intermediate_size": 32)"));
  spec_.mutable_optimizer()->set_lr(1e-4);
  spec_.set_max_steps(10);
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.moe().aux_loss(), "global");
  EXPECT_EQ(spec_.moe().aux_loss_scope(), "all_layers");
  EXPECT_FALSE(spec_.moe().has_router_aux_loss_coef());

  spec_.clear_moe();
  spec_.mutable_moe()->set_aux_loss("micro_batch");
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.moe().aux_loss(), "micro_batch");
  EXPECT_EQ(spec_.moe().aux_loss_scope(), "all_layers");
}

// An SDAR config.json as JetLM's SDAR checkpoints carry it: Qwen3's keys
// and SDAR's own.
constexpr char kSdarConfig[] = R"({
  "architectures": ["SDARForCausalLM"], "model_type": "sdar",
  "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig",
               "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
  "block_size": 4, "mask_token_id": 319, "fuse_cross_entropy": true,
  "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
  "num_attention_heads": 4, "max_position_embeddings": 1024, "rope_theta": 1000000, "use_sliding_window": false,
  "sliding_window": null, "max_window_layers": 28, "torch_dtype": "bfloat16",
  "bos_token_id": 151643, "eos_token_id": 151643, "use_cache": true %s})";

class SdarCheckpointTest : public JobSpecFilesTest {
 protected:
  void SetUp() override {
    JobSpecFilesTest::SetUp();
    WriteSdarConfig("");
    spec_.set_task("block_diffusion");
    spec_.mutable_optimizer()->set_lr(1e-4);
    spec_.set_max_steps(10);
  }
  // kSdarConfig with `extra` (", \"key\": value") before its closing brace.
  void WriteSdarConfig(const std::string& extra) {
    std::string text = kSdarConfig;
    text.replace(text.find("%s"), 2, extra);
    WriteConfig(text);
  }
};

TEST_F(SdarCheckpointTest, BlockSizeAndMaskTokenFillTheSpecAndTheOtherKeysAreAccepted) {
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.block_diffusion().block_length(), 4);
  EXPECT_EQ(spec_.block_diffusion().mask_token_id(), 319);

  // Values that agree with the checkpoint are accepted too.
  WriteSdarConfig(R"(, "enable_block_generation": true, "use_regular_causal": false)");
  EXPECT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
}

TEST_F(SdarCheckpointTest, TrainsOnlyByBlockDiffusion) {
  spec_.set_task("causal_lm");
  const absl::Status s = PrepareJobSpec(&spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("is an SDAR block-diffusion checkpoint (model_type sdar); "
                                     "it trains with task: block_diffusion, not task: causal_lm"));
}

TEST_F(SdarCheckpointTest, ASpecThatDisagreesWithTheCheckpointIsRefusedNamingBoth) {
  spec_.mutable_block_diffusion()->set_block_length(8);
  absl::Status s = PrepareJobSpec(&spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("block_diffusion.block_length = 8 disagrees with block_size = 4 in"));

  spec_.mutable_block_diffusion()->set_block_length(4);
  spec_.mutable_block_diffusion()->set_mask_token_id(7);
  s = PrepareJobSpec(&spec_);
  EXPECT_THAT(s.message(),
              HasSubstr("block_diffusion.mask_token_id = 7 disagrees with mask_token_id = 319"));
}

TEST_F(SdarCheckpointTest, EveryOtherKeyIsRefusedByName) {
  for (const auto& [extra, message] : std::vector<std::pair<std::string, std::string>>{
           {R"(, "noise": {"type": "uniform"})", "key noise is neither Qwen3's nor one of SDAR's"},
           {R"(, "use_regular_causal": true)", "key use_regular_causal must be false or absent"},
           {R"(, "fuse_cross_entropy": "yes")", "key fuse_cross_entropy must be true or false"},
           {R"(, "layer_types": ["sliding_attention"])", "key layer_types must list only"},
       }) {
    WriteSdarConfig(extra);
    const absl::Status s = PrepareJobSpec(&spec_);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_THAT(s.message(), HasSubstr(message)) << extra;
  }
  std::string moe = kSdarConfig;
  moe.replace(moe.find("SDARForCausalLM\"]"), 15, "SDARMoeForCausalLM");
  moe.replace(moe.find("%s"), 2, "");
  WriteConfig(moe);
  EXPECT_THAT(PrepareJobSpec(&spec_).message(),
              HasSubstr("key architectures must be [\"SDARForCausalLM\"]"));
  EXPECT_THAT(PrepareJobSpec(&spec_).message(), HasSubstr("model_type sdar_moe"));
}

// SDAR-30B-A3B's shape of config.json: Qwen3-MoE's keys under model_type sdar_moe.
std::string SdarMoeConfig(const std::string& extra) {
  std::string text = kSdarConfig;
  text.replace(text.find("SDARForCausalLM\"]"), 15, "SDARMoeForCausalLM");
  text.replace(text.find("\"sdar\""), 6, "\"sdar_moe\"");
  text.replace(text.find("%s"), 2,
               R"(, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,
                  "router_aux_loss_coef": 0.001, "output_router_logits": false)" +
                   extra);
  return text;
}

TEST_F(SdarCheckpointTest, SdarsMixtureOfExpertsTrainsByBlockDiffusionWithQwen3MoesKeys) {
  WriteConfig(SdarMoeConfig(""));
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.block_diffusion().block_length(), 4);

  v1::JobSpec causal = spec_;
  causal.set_task("causal_lm");
  causal.clear_block_diffusion();
  EXPECT_THAT(PrepareJobSpec(&causal).message(),
              HasSubstr("(model_type sdar_moe); it trains with task: block_diffusion"));

  // What SDAR's engine does not do is refused by name.
  WriteConfig(SdarMoeConfig(R"(, "noise": 1)"));
  EXPECT_THAT(PrepareJobSpec(&spec_).message(), HasSubstr("key noise is neither"));
  std::string unnormalised = SdarMoeConfig("");
  unnormalised.replace(unnormalised.find("\"norm_topk_prob\": true"), 22,
                       "\"norm_topk_prob\": false");
  WriteConfig(unnormalised);
  EXPECT_THAT(PrepareJobSpec(&spec_).message(), HasSubstr("norm_topk_prob must be true or absent"));
}

}  // namespace
}  // namespace ballast
