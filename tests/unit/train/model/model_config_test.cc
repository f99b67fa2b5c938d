#include "common/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/train/io/file_tree.h"

namespace ballast::train {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;

// Qwen3-4B's config.json: head_dim 128 is explicit, not hidden_size / heads (80).
json Qwen3Config() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "initializer_range": 0.02,
    "intermediate_size": 9728,
    "max_position_embeddings": 40960,
    "max_window_layers": 36,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_hidden_layers": 36,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000,
    "sliding_window": null,
    "tie_word_embeddings": true,
    "torch_dtype": "bfloat16",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// Qwen2.5-0.5B's config.json, which has no attention_bias key.
json Qwen2Config() {
  return json::parse(R"({
    "hidden_act": "silu",
    "hidden_size": 896,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

// Llama-3.2-1B's config.json.
json Llama32Config() {
  return json::parse(R"({
    "attention_bias": false,
    "attention_dropout": 0.0,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "mlp_bias": false,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 16,
    "num_key_value_heads": 8,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
      "factor": 32.0,
      "high_freq_factor": 4.0,
      "low_freq_factor": 1.0,
      "original_max_position_embeddings": 8192,
      "rope_type": "llama3"
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": true,
    "vocab_size": 128256
  })");
}

absl::StatusOr<ModelConfig> Parse(const json& j) { return ParseModelConfig(j.dump()); }

// Expects INVALID_ARGUMENT whose message contains every one of `parts`.
void ExpectInvalid(const json& j, std::initializer_list<std::string> parts) {
  const absl::Status s = Parse(j).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  for (const std::string& part : parts) EXPECT_THAT(s.message(), HasSubstr(part));
}

TEST(ModelConfig, ParsesQwen3WithExplicitHeadDim) {
  auto c = Parse(Qwen3Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->vocab_size, 151936);
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->intermediate_size, 9728);
  EXPECT_EQ(c->num_hidden_layers, 36);
  EXPECT_EQ(c->num_attention_heads, 32);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_EQ(c->rope_scaling.type, "default");
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->mlp_bias);
  EXPECT_TRUE(c->qk_norm);
}

TEST(ModelConfig, SdarIsQwen3sDecoder) {
  json j = Qwen3Config();
  j["model_type"] = "sdar";
  j["block_size"] = 4;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "sdar");
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfig, Qwen2AlwaysHasAttentionBias) {
  auto c = Parse(Qwen2Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 64);

  json j = Qwen2Config();
  j["attention_bias"] = false;
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
}

TEST(ModelConfig, ParsesLlama3RopeScaling) {
  auto c = Parse(Llama32Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
}

TEST(ModelConfig, ParsesLinearRopeScalingWithLegacyTypeKey) {
  json j = Llama32Config();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
}

TEST(ModelConfig, ReadsRopeParametersFromTransformers5) {
  json j = Qwen3Config();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_EQ(c->rope_scaling.type, "default");
}

TEST(ModelConfig, RejectsRopeThetaThatDisagreesWithRopeParameters) {
  json j = Qwen3Config();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  ExpectInvalid(j, {"rope_theta", "rope_parameters.rope_theta"});
}

TEST(ModelConfig, AppliesDefaults) {
  json j = Llama32Config();
  for (const char* key :
       {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling",
        "hidden_act", "tie_word_embeddings", "attention_bias", "mlp_bias", "attention_dropout"}) {
    j.erase(key);
  }
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 32);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, "default");
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfig, NullHeadDimIsDerived) {
  json j = Qwen2Config();
  j["head_dim"] = nullptr;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 896 / 14);
}

TEST(ModelConfig, LlamaAttentionBiasFollowsKey) {
  json j = Llama32Config();
  j["attention_bias"] = true;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
}

TEST(ModelConfig, RejectsUnknownModelType) {
  json j = Qwen3Config();
  j["model_type"] = "mixtral";
  ExpectInvalid(j, {"model_type", "mixtral", "llama, qwen2, qwen3, sdar"});
}

TEST(ModelConfig, RejectsMissingRequiredKey) {
  for (const char* key : {"model_type", "vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "max_position_embeddings"}) {
    json j = Qwen3Config();
    j.erase(key);
    SCOPED_TRACE(key);
    ExpectInvalid(j, {key, "required"});
  }
}

TEST(ModelConfig, RejectsSizesLargerThanAnyModel) {
  // num_hidden_layers 10^9 once kept a rank loading for over a minute.
  for (const char* key : {"num_hidden_layers", "vocab_size", "hidden_size", "intermediate_size",
                          "num_attention_heads", "max_position_embeddings"}) {
    json j = Qwen3Config();
    j[key] = 1000000000;
    SCOPED_TRACE(key);
    ExpectInvalid(j, {key, "must be at most", "got 1000000000", "is config.json corrupt?"});
  }
}

TEST(ModelConfig, RejectsWrongType) {
  json j = Qwen3Config();
  j["hidden_size"] = "2560";
  ExpectInvalid(j, {"hidden_size must be an integer"});

  j = Qwen3Config();
  j["num_hidden_layers"] = 36.5;
  ExpectInvalid(j, {"num_hidden_layers must be an integer"});

  j = Qwen3Config();
  j["tie_word_embeddings"] = 1;
  ExpectInvalid(j, {"tie_word_embeddings must be a boolean"});

  j = Qwen3Config();
  j["rms_norm_eps"] = "1e-6";
  ExpectInvalid(j, {"rms_norm_eps must be a number"});
}

TEST(ModelConfig, RejectsOutOfRangeValues) {
  json j = Qwen3Config();
  j["vocab_size"] = 0;
  ExpectInvalid(j, {"vocab_size", "> 0"});

  j = Qwen3Config();
  j["rms_norm_eps"] = -1e-6;
  ExpectInvalid(j, {"rms_norm_eps", "> 0"});

  j = Qwen3Config();
  j["rope_theta"] = 0;
  ExpectInvalid(j, {"rope_theta", "> 0"});
}

TEST(ModelConfig, RejectsKvHeadsThatDoNotDivideHeads) {
  json j = Qwen3Config();
  j["num_key_value_heads"] = 5;
  ExpectInvalid(j, {"num_key_value_heads", "divide"});
}

TEST(ModelConfig, RejectsUnderivableHeadDim) {
  json j = Qwen3Config();
  j.erase("head_dim");
  j["num_attention_heads"] = 24;
  j["num_key_value_heads"] = 8;
  ExpectInvalid(j, {"head_dim", "2560"});
}

TEST(ModelConfig, RejectsOddOrOversizedHeadDim) {
  json j = Qwen3Config();
  j["head_dim"] = 127;
  ExpectInvalid(j, {"head_dim", "even", "256"});
  j["head_dim"] = 512;
  ExpectInvalid(j, {"head_dim", "even", "256"});
}

TEST(ModelConfig, RejectsUnsupportedHiddenAct) {
  json j = Qwen3Config();
  j["hidden_act"] = "gelu";
  ExpectInvalid(j, {"hidden_act", "silu", "gelu"});
}

TEST(ModelConfig, RejectsUnsupportedRopeType) {
  json j = Qwen3Config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectInvalid(j, {"rope_scaling.rope_type", "yarn", "default, linear, llama3"});
}

TEST(ModelConfig, RejectsRopeScalingWithoutType) {
  json j = Qwen3Config();
  j["rope_scaling"] = {{"factor", 4.0}};
  ExpectInvalid(j, {"rope_scaling.rope_type", "required"});
}

TEST(ModelConfig, RejectsLinearRopeScalingWithoutFactor) {
  json j = Llama32Config();
  j["rope_scaling"] = {{"rope_type", "linear"}};
  ExpectInvalid(j, {"rope_scaling.factor", "required"});
}

TEST(ModelConfig, RejectsIncompleteLlama3RopeScaling) {
  json j = Llama32Config();
  j["rope_scaling"].erase("low_freq_factor");
  ExpectInvalid(j, {"rope_scaling.low_freq_factor", "required"});

  j = Llama32Config();
  j["rope_scaling"].erase("original_max_position_embeddings");
  ExpectInvalid(j, {"rope_scaling.original_max_position_embeddings", "required"});

  j = Llama32Config();
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  ExpectInvalid(j, {"rope_scaling.high_freq_factor", "low_freq_factor"});
}

TEST(ModelConfig, RejectsSlidingWindow) {
  json j = Qwen2Config();
  j["use_sliding_window"] = true;
  ExpectInvalid(j, {"use_sliding_window is not supported"});
}

TEST(ModelConfig, RejectsMlpBias) {
  json j = Llama32Config();
  j["mlp_bias"] = true;
  ExpectInvalid(j, {"mlp_bias", "false"});
}

TEST(ModelConfig, RejectsAttentionDropout) {
  json j = Llama32Config();
  j["attention_dropout"] = 0.1;
  ExpectInvalid(j, {"attention_dropout", "0"});
}

TEST(ModelConfig, RejectsTextThatIsNotAJsonObject) {
  EXPECT_EQ(ParseModelConfig("{").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseModelConfig("[]").status().code(), absl::StatusCode::kInvalidArgument);
}

// Shaped like Qwen3.5-4B's released config.json: the vision-language
// wrapper, the decoder's keys in text_config, rope settings in
// rope_parameters, the tie at the top level, and keys of the parts the
// trainer does not read (vision_config, mtp_num_hidden_layers).
json Qwen35Config() {
  return json::parse(R"({
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "image_token_id": 248056,
    "model_type": "qwen3_5",
    "text_config": {
      "attn_output_gate": true,
      "full_attention_interval": 4,
      "head_dim": 256,
      "hidden_act": "silu",
      "hidden_size": 2560,
      "intermediate_size": 9216,
      "linear_conv_kernel_dim": 4,
      "linear_key_head_dim": 128,
      "linear_num_key_heads": 16,
      "linear_num_value_heads": 32,
      "linear_value_head_dim": 128,
      "max_position_embeddings": 262144,
      "model_type": "qwen3_5_text",
      "mtp_num_hidden_layers": 1,
      "num_attention_heads": 16,
      "num_hidden_layers": 8,
      "num_key_value_heads": 4,
      "rms_norm_eps": 1e-06,
      "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10],
                          "partial_rotary_factor": 0.25, "rope_theta": 10000000,
                          "rope_type": "default"},
      "vocab_size": 248320
    },
    "tie_word_embeddings": true,
    "vision_config": {"depth": 24, "hidden_size": 1024, "model_type": "qwen3_5"}
  })");
}

TEST(ModelConfig, ParsesQwen35sTextDecoderFromTheVisionLanguageWrapper) {
  auto c = Parse(Qwen35Config());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3_5");
  EXPECT_EQ(c->tensor_prefix, "model.language_model.");
  EXPECT_EQ(c->hidden_size, 2560);
  EXPECT_EQ(c->head_dim, 256);
  EXPECT_EQ(c->rotary_dim, 64);  // a quarter of head_dim
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e7);
  EXPECT_TRUE(c->tie_word_embeddings);  // the wrapper's key, as transformers ties
  EXPECT_TRUE(c->attention_output_gate);
  EXPECT_TRUE(c->zero_centred_norm);
  EXPECT_TRUE(c->qk_norm);
  // full_attention_interval 4: layers 3 and 7 are full attention.
  ASSERT_EQ(c->layer_types.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(c->layer_types[i],
              (i + 1) % 4 == 0 ? TokenMixer::kAttention : TokenMixer::kGatedDeltaNet)
        << i;
  }
  EXPECT_TRUE(c->has_linear_attention());
  EXPECT_EQ(c->linear_attention.num_key_heads, 16);
  EXPECT_EQ(c->linear_attention.num_value_heads, 32);
  EXPECT_EQ(c->linear_attention.conv_dim(), 2 * 16 * 128 + 32 * 128);
  EXPECT_EQ(c->linear_attention.conv_kernel, 4);
}

TEST(ModelConfig, ParsesQwen35TextAtTheRootWithLayerTypesAndOlderTopLevelRopeKeys) {
  json j = Qwen35Config()["text_config"];
  j["layer_types"] = {"linear_attention", "full_attention", "linear_attention", "full_attention",
                      "full_attention",   "full_attention", "full_attention",   "linear_attention"};
  j.erase("rope_parameters");
  j["rope_theta"] = 5e6;
  j["partial_rotary_factor"] = 0.5;
  j["tie_word_embeddings"] = false;
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3_5_text");
  EXPECT_EQ(c->tensor_prefix, "model.");
  EXPECT_EQ(c->rotary_dim, 128);
  EXPECT_DOUBLE_EQ(c->rope_theta, 5e6);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->layer_types[0], TokenMixer::kGatedDeltaNet);
  EXPECT_EQ(c->layer_types[1], TokenMixer::kAttention);
  EXPECT_EQ(c->layer_types[7], TokenMixer::kGatedDeltaNet);
}

TEST(ModelConfig, DenseFamiliesHaveOnlyFullAttentionAndRotateTheWholeHead) {
  json j = Qwen3Config();
  auto c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_linear_attention());
  EXPECT_EQ(c->layer_types.size(), 36u);
  EXPECT_EQ(c->rotary_dim, c->head_dim);
  EXPECT_FALSE(c->attention_output_gate);
  EXPECT_FALSE(c->zero_centred_norm);
  j["layer_types"] = json::array();
  for (int i = 0; i < 36; ++i) j["layer_types"].push_back("full_attention");
  EXPECT_TRUE(Parse(j).ok()) << Parse(j).status();
  j["layer_types"][5] = "linear_attention";
  ExpectInvalid(j, {"layer_types[5] must be one of full_attention; got \"linear_attention\""});
}

TEST(ModelConfig, RefusesWhatTheHybridDecoderDoesNotImplementNamingTheKey) {
  auto edited = [](const std::function<void(json&)>& edit) {
    json j = Qwen35Config();
    edit(j["text_config"]);
    return j;
  };
  ExpectInvalid(edited([](json& t) { t["attn_output_gate"] = false; }),
                {"text_config.attn_output_gate is false"});
  ExpectInvalid(edited([](json& t) { t["num_experts"] = 64; }),
                {"text_config.num_experts is 64", "mixture-of-experts"});
  ExpectInvalid(edited([](json& t) { t["moe_intermediate_size"] = 512; }),
                {"text_config.moe_intermediate_size"});
  ExpectInvalid(edited([](json& t) {
                  t["linear_num_value_heads"] = 24;
                  t["linear_num_key_heads"] = 16;
                }),
                {"text_config.linear_num_value_heads must be a multiple of linear_num_key_heads "
                 "(16), got 24"});
  ExpectInvalid(edited([](json& t) {
                  t["layer_types"] = json::array();
                  for (int i = 0; i < 8; ++i) t["layer_types"].push_back("linear_attention");
                  t["layer_types"][2] = "sliding_attention";
                }),
                {"text_config.layer_types[2] must be one of full_attention, linear_attention"});
  ExpectInvalid(edited([](json& t) { t["layer_types"] = {"full_attention"}; }),
                {"text_config.layer_types must be a list of num_hidden_layers (8)"});
  ExpectInvalid(
      edited([](json& t) { t["rope_parameters"]["partial_rotary_factor"] = 0.27; }),
      {"text_config.rope_parameters.partial_rotary_factor gives a rotary dimension of 69"});
  ExpectInvalid(edited([](json& t) { t["rope_parameters"]["partial_rotary_factor"] = 2.0; }),
                {"partial_rotary_factor gives a rotary dimension of 512"});
  ExpectInvalid(edited([](json& t) { t["model_type"] = "qwen3"; }),
                {"text_config.model_type must be \"qwen3_5_text\""});
  ExpectInvalid(edited([](json& t) { t.erase("vocab_size"); }), {"text_config.vocab_size"});
  json no_text = Qwen35Config();
  no_text.erase("text_config");
  ExpectInvalid(no_text, {"text_config is required"});
}

TEST(ModelConfig, Qwen35TiesByTheWrappersKeyAndFallsBackToTextConfigs) {
  json j = Qwen35Config();
  j["tie_word_embeddings"] = false;
  j["text_config"]["tie_word_embeddings"] = true;
  EXPECT_FALSE(Parse(j)->tie_word_embeddings);
  j.erase("tie_word_embeddings");
  EXPECT_TRUE(Parse(j)->tie_word_embeddings);
}

class LoadModelConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl =
        (std::filesystem::path(::testing::TempDir()) / "model_config.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  std::string dir_;
};

TEST_F(LoadModelConfigTest, ReadsConfigJson) {
  std::ofstream(dir_ + "/config.json") << Qwen3Config().dump(2);
  auto c = LoadModelConfig(dir_);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
}

TEST_F(LoadModelConfigTest, MissingFileIsNotFoundNamingPath) {
  const absl::Status s = LoadModelConfig(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/config.json"));
}

TEST_F(LoadModelConfigTest, ParseErrorNamesPath) {
  json j = Qwen3Config();
  j["hidden_act"] = "relu";
  std::ofstream(dir_ + "/config.json") << j.dump();
  const absl::Status s = LoadModelConfig(dir_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(dir_ + "/config.json"));
  EXPECT_THAT(s.message(), HasSubstr("hidden_act"));
}

// Qwen3-30B-A3B's config.json (Qwen/Qwen3-30B-A3B on the Hub).
json Qwen3MoeConfig() {
  return json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": false,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": true,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": false,
    "rms_norm_eps": 1e-06,
    "rope_scaling": null,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": null,
    "tie_word_embeddings": false,
    "torch_dtype": "bfloat16",
    "use_cache": true,
    "use_sliding_window": false,
    "vocab_size": 151936
  })");
}

TEST(ModelConfig, ParsesQwen3Moe) {
  absl::StatusOr<ModelConfig> c = Parse(Qwen3MoeConfig());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.top_k, 8);
  EXPECT_EQ(c->moe.moe_intermediate_size, 768);
  EXPECT_TRUE(c->moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->moe.router_aux_loss_coef, 0.001);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->head_dim, 128);
  for (int64_t i = 0; i < 48; ++i) EXPECT_TRUE(c->moe.sparse(i)) << i;
  EXPECT_TRUE(c->has_experts());
}

TEST(ModelConfig, Qwen3MoeSparseLayersFollowHfsRule) {
  json j = Qwen3MoeConfig();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  // Sparse when not in mlp_only_layers and (i + 1) % step == 0: layers 1 and 5.
  const std::vector<bool> want = {false, true, false, false, false, true};
  for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(c->moe.sparse(i), want[i]) << i;

  // Absent keys take Qwen3MoeConfig's defaults (transformers 4.57.6).
  for (const char* key :
       {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
        "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef"}) {
    j.erase(key);
  }
  c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.num_experts, 128);
  EXPECT_EQ(c->moe.top_k, 8);
  EXPECT_EQ(c->moe.moe_intermediate_size, 768);
  EXPECT_FALSE(c->moe.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c->moe.router_aux_loss_coef, 0.001);
  for (int64_t i = 0; i < 6; ++i) EXPECT_TRUE(c->moe.sparse(i)) << i;
}

TEST(ModelConfig, RefusesBadExpertKeysNamingThem) {
  auto edited = [](const std::function<void(json&)>& edit) {
    json j = Qwen3MoeConfig();
    edit(j);
    return j;
  };
  ExpectInvalid(edited([](json& j) { j["num_experts_per_tok"] = 129; }),
                {"num_experts_per_tok must be <= num_experts (128), got 129"});
  ExpectInvalid(edited([](json& j) { j["num_experts"] = 0; }), {"num_experts must be > 0"});
  ExpectInvalid(edited([](json& j) { j["moe_intermediate_size"] = -4; }),
                {"moe_intermediate_size must be > 0, got -4"});
  ExpectInvalid(edited([](json& j) { j["num_experts_per_tok"] = 0; }),
                {"num_experts_per_tok must be > 0"});
  ExpectInvalid(edited([](json& j) { j["decoder_sparse_step"] = 0; }),
                {"decoder_sparse_step must be > 0"});
  ExpectInvalid(edited([](json& j) { j["mlp_only_layers"] = {48}; }),
                {"mlp_only_layers must hold layer indices in 0..47, got 48"});
  ExpectInvalid(edited([](json& j) { j["router_aux_loss_coef"] = -1; }),
                {"router_aux_loss_coef must be a finite number >= 0"});
  ExpectInvalid(edited([](json& j) { j["output_router_logits"] = "yes"; }),
                {"output_router_logits must be a boolean"});
}

TEST(ModelConfig, ExpertKeysStayRefusedForTheDenseFamilies) {
  json j = Qwen3Config();
  j["num_experts"] = 8;
  ExpectInvalid(j, {"num_experts is 8", "mixture-of-experts"});
}

}  // namespace
}  // namespace ballast::train
