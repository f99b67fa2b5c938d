// A tiny random Qwen3 model folder and token data, written in C++ for the
// trainer's unit tests (the parity tests make theirs with transformers).
#ifndef BALLAST_TESTS_UNIT_TRAIN_TINY_MODEL_H_
#define BALLAST_TESTS_UNIT_TRAIN_TINY_MODEL_H_

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_config.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {

struct TinyModel {
  static constexpr int64_t kVocab = 64;
  static constexpr int64_t kHidden = 32;
  static constexpr int64_t kIntermediate = 48;
  static constexpr int64_t kLayers = 2;
  static constexpr int64_t kHeads = 4;
  static constexpr int64_t kKvHeads = 2;
  static constexpr int64_t kHeadDim = 8;
  static constexpr int64_t kMaxPositions = 64;
};

// Writes dir/config.json and dir/model.safetensors with weights drawn from
// `seed`, changed by `edit` when given (a test's poisoned weight), and
// returns dir.
inline std::string WriteTinyQwen3(
    const std::string& dir, uint64_t seed,
    const std::function<void(std::map<std::string, at::Tensor>&)>& edit = {}) {
  using M = TinyModel;
  std::filesystem::create_directories(dir);
  std::ofstream(std::filesystem::path(dir) / "config.json") << absl::StrCat(
      R"({"model_type": "qwen3", "vocab_size": )", M::kVocab, R"(, "hidden_size": )", M::kHidden,
      R"(, "intermediate_size": )", M::kIntermediate, R"(, "num_hidden_layers": )", M::kLayers,
      R"(, "num_attention_heads": )", M::kHeads, R"(, "num_key_value_heads": )", M::kKvHeads,
      R"(, "head_dim": )", M::kHeadDim, R"(, "max_position_embeddings": )", M::kMaxPositions,
      R"(, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false})");
  at::Generator gen = at::detail::createCPUGenerator(seed);
  auto randn = [&](std::vector<int64_t> shape) {
    return at::normal(0.0, 0.2, shape, gen, at::TensorOptions().dtype(torch::kFloat));
  };
  const int64_t q = M::kHeads * M::kHeadDim, kv = M::kKvHeads * M::kHeadDim;
  std::map<std::string, at::Tensor> t = {
      {"model.embed_tokens.weight", randn({M::kVocab, M::kHidden})},
      {"model.norm.weight", torch::ones({M::kHidden})},
      {"lm_head.weight", randn({M::kVocab, M::kHidden})}};
  for (int64_t i = 0; i < M::kLayers; ++i) {
    const std::string p = LayerPrefix(i);
    t[p + "input_layernorm.weight"] = torch::ones({M::kHidden});
    t[p + "post_attention_layernorm.weight"] = torch::ones({M::kHidden});
    t[p + "self_attn.q_proj.weight"] = randn({q, M::kHidden});
    t[p + "self_attn.k_proj.weight"] = randn({kv, M::kHidden});
    t[p + "self_attn.v_proj.weight"] = randn({kv, M::kHidden});
    t[p + "self_attn.o_proj.weight"] = randn({M::kHidden, q});
    t[p + "self_attn.q_norm.weight"] = torch::ones({M::kHeadDim});
    t[p + "self_attn.k_norm.weight"] = torch::ones({M::kHeadDim});
    t[p + "mlp.gate_proj.weight"] = randn({M::kIntermediate, M::kHidden});
    t[p + "mlp.up_proj.weight"] = randn({M::kIntermediate, M::kHidden});
    t[p + "mlp.down_proj.weight"] = randn({M::kHidden, M::kIntermediate});
  }
  if (edit) edit(t);
  const absl::Status s =
      WriteSafetensors((std::filesystem::path(dir) / "model.safetensors").string(), t);
  if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  return dir;
}

// The tiny Qwen3 as a Qwen3-MoE (transformers 4.57's layout): every layer's
// MLP is a router (mlp.gate) over kExperts experts, top-2, each an MLP of
// kExpertWidth stored one tensor per expert and projection, as released
// checkpoints store them.
struct TinyMoe {
  static constexpr int64_t kExperts = 4;
  static constexpr int64_t kExpertWidth = 24;
};
inline std::string WriteTinyQwen3Moe(const std::string& dir, uint64_t seed) {
  using M = TinyModel;
  at::Generator gen = at::detail::createCPUGenerator(seed + 1);
  auto randn = [&](std::vector<int64_t> shape) {
    return at::normal(0.0, 0.2, shape, gen, at::TensorOptions().dtype(torch::kFloat));
  };
  WriteTinyQwen3(dir, seed, [&](std::map<std::string, at::Tensor>& t) {
    for (int64_t i = 0; i < M::kLayers; ++i) {
      const std::string mlp = LayerPrefix(i) + "mlp.";
      for (const char* dense : {"gate_proj", "up_proj", "down_proj"}) {
        t.erase(absl::StrCat(mlp, dense, ".weight"));
      }
      t[mlp + "gate.weight"] = randn({TinyMoe::kExperts, M::kHidden});
      for (int64_t e = 0; e < TinyMoe::kExperts; ++e) {
        const std::string expert = absl::StrCat(mlp, "experts.", e, ".");
        t[expert + "gate_proj.weight"] = randn({TinyMoe::kExpertWidth, M::kHidden});
        t[expert + "up_proj.weight"] = randn({TinyMoe::kExpertWidth, M::kHidden});
        t[expert + "down_proj.weight"] = randn({M::kHidden, TinyMoe::kExpertWidth});
      }
    }
  });
  std::ofstream(std::filesystem::path(dir) / "config.json") << absl::StrCat(
      R"({"model_type": "qwen3_moe", "vocab_size": )", M::kVocab, R"(, "hidden_size": )",
      M::kHidden, R"(, "intermediate_size": )", M::kIntermediate, R"(, "num_hidden_layers": )",
      M::kLayers, R"(, "num_attention_heads": )", M::kHeads, R"(, "num_key_value_heads": )",
      M::kKvHeads, R"(, "head_dim": )", M::kHeadDim, R"(, "max_position_embeddings": )",
      M::kMaxPositions, R"(, "num_experts": )", TinyMoe::kExperts,
      R"(, "num_experts_per_tok": 2, "moe_intermediate_size": )", TinyMoe::kExpertWidth,
      R"(, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": true,)",
      R"( "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false})");
  return dir;
}

// Writes `count` documents of 4..12 random tokens to `path`; every
// `unsupervised_every`-th one (when > 0) has no supervised label.
inline std::string WriteTokenData(const std::string& path, int count, uint64_t seed,
                                  int unsupervised_every = 0) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::ofstream out(path);
  for (int d = 0; d < count; ++d) {
    const int64_t n = 4 + at::randint(9, {1}, gen).item<int64_t>();
    at::Tensor ids = at::randint(TinyModel::kVocab, {n}, gen);
    std::vector<int64_t> v(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
    out << "{\"input_ids\": [" << absl::StrJoin(v, ", ") << "]";
    if (unsupervised_every > 0 && d % unsupervised_every == 0) {
      out << ", \"labels\": [" << absl::StrJoin(std::vector<int64_t>(n, -100), ", ") << "]";
    }
    out << "}\n";
  }
  return path;
}

// Writes `count` short SFT samples to `path`, freshly random on every run:
// a prompt of [prompt_min, prompt_max] unsupervised tokens, then an answer
// of [answer_min, answer_max] supervised ones, ids below `vocab`. Short
// against a row, they are what packing puts several to a row (the setting
// where SDAR's packed loss read 0).
inline std::string WriteSftSamples(const std::string& path, int count, int prompt_min,
                                   int prompt_max, int answer_min, int answer_max, int64_t vocab) {
  std::mt19937 rng(std::random_device{}());
  std::ofstream out(path);
  for (int d = 0; d < count; ++d) {
    const int prompt = std::uniform_int_distribution<int>(prompt_min, prompt_max)(rng);
    const int answer = std::uniform_int_distribution<int>(answer_min, answer_max)(rng);
    std::vector<int64_t> ids, labels;
    for (int t = 0; t < prompt + answer; ++t) {
      ids.push_back(static_cast<int64_t>(rng() % vocab));
      labels.push_back(t < prompt ? -100 : ids.back());
    }
    out << "{\"input_ids\": [" << absl::StrJoin(ids, ",") << "], \"labels\": ["
        << absl::StrJoin(labels, ",") << "]}\n";
  }
  return path;
}

}  // namespace ballast::train

#endif  // BALLAST_TESTS_UNIT_TRAIN_TINY_MODEL_H_
