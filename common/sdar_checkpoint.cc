#include "common/sdar_checkpoint.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

// The keys of transformers' Qwen3Config and PretrainedConfig that an SDAR
// config.json holds. The decoder's config parser reads and checks the ones
// that shape the model (worker/train/model/model_config); the others do not
// change training: initializer_range (random initialisation only),
// use_cache (inference), the special token ids (the tokenizer's files give
// them), torch_dtype (the safetensors headers give it), and sliding_window
// and max_window_layers (read only with use_sliding_window, which the parser
// refuses).
constexpr std::array<absl::string_view, 31> kQwen3Keys = {"model_type",
                                                          "architectures",
                                                          "vocab_size",
                                                          "hidden_size",
                                                          "intermediate_size",
                                                          "num_hidden_layers",
                                                          "num_attention_heads",
                                                          "num_key_value_heads",
                                                          "head_dim",
                                                          "hidden_act",
                                                          "max_position_embeddings",
                                                          "initializer_range",
                                                          "rms_norm_eps",
                                                          "use_cache",
                                                          "tie_word_embeddings",
                                                          "rope_theta",
                                                          "rope_scaling",
                                                          "rope_parameters",
                                                          "attention_bias",
                                                          "use_sliding_window",
                                                          "sliding_window",
                                                          "max_window_layers",
                                                          "layer_types",
                                                          "attention_dropout",
                                                          "bos_token_id",
                                                          "eos_token_id",
                                                          "pad_token_id",
                                                          "torch_dtype",
                                                          "dtype",
                                                          "transformers_version",
                                                          "_name_or_path"};

// The keys of transformers' Qwen3MoeConfig beyond Qwen3Config's, which an
// sdar_moe config.json holds (the decoder's config parser reads them).
constexpr std::array<absl::string_view, 8> kQwen3MoeKeys = {
    "num_experts",     "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step",
    "mlp_only_layers", "norm_topk_prob",      "router_aux_loss_coef",  "output_router_logits"};

// SDAR's own keys; sdar_checkpoint.h says what becomes of each.
constexpr std::array<absl::string_view, 6> kSdarKeys = {
    "block_size", "mask_token_id",     "fuse_cross_entropy", "enable_block_generation",
    "auto_map",   "use_regular_causal"};

template <size_t N>
bool Contains(const std::array<absl::string_view, N>& keys, absl::string_view key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

std::string ModelType(const nlohmann::json& config) {
  const auto type = config.find("model_type");
  return type != config.end() && type->is_string() ? type->get<std::string>() : "";
}

bool IsSdar(const nlohmann::json& config) { return IsSdarModelType(ModelType(config)); }

// The config's integer `key` > 0 (< 0 when absent or null); `*bad` is set
// when present but not such an integer.
int64_t PositiveIntKey(const nlohmann::json& config, const char* key, bool* bad) {
  const auto it = config.find(key);
  *bad = false;
  if (it == config.end() || it->is_null()) return -1;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    *bad = true;
    return -1;
  }
  return it->get<int64_t>();
}

absl::Status Refuse(absl::string_view config_name, absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("model.path: ", config_name, ": key ", key, " ", why));
}

}  // namespace

bool IsSdarModelType(absl::string_view model_type) {
  return model_type == kSdarModelType || model_type == kSdarMoeModelType;
}

void ApplySdarDefaults(const nlohmann::json& config, v1::JobSpec* spec) {
  if (!config.is_object() || !IsSdar(config) || spec->task() != "block_diffusion") return;
  v1::BlockDiffusionSpec* b = spec->mutable_block_diffusion();
  bool bad = false;
  if (const int64_t block_size = PositiveIntKey(config, "block_size", &bad);
      b->block_length() == 0 && block_size > 0 && block_size <= INT32_MAX) {
    b->set_block_length(static_cast<int32_t>(block_size));
  }
  if (const int64_t mask = PositiveIntKey(config, "mask_token_id", &bad);
      !b->has_mask_token_id() && mask >= 0) {
    b->set_mask_token_id(mask);
  }
}

absl::Status CheckSdarConfig(const nlohmann::json& config, const v1::JobSpec& spec,
                             absl::string_view config_name) {
  const std::string model_type = ModelType(config);
  const bool moe = model_type == kSdarMoeModelType;
  if (spec.task() != "block_diffusion") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.path: ", config_name, " is an SDAR block-diffusion checkpoint ", "(model_type ",
        model_type, "); it trains with task: block_diffusion, not ", "task: ", spec.task()));
  }
  for (const auto& [key, value] : config.items()) {
    if (!Contains(kQwen3Keys, key) && !Contains(kSdarKeys, key) &&
        !(moe && Contains(kQwen3MoeKeys, key))) {
      return Refuse(config_name, key,
                    "is neither Qwen3's nor one of SDAR's that Ballast knows (block_size, "
                    "mask_token_id, fuse_cross_entropy, enable_block_generation, auto_map, "
                    "use_regular_causal); it would be ignored, so it is refused. Remove it "
                    "if it does not change the model");
    }
  }

  const v1::BlockDiffusionSpec& b = spec.block_diffusion();
  bool bad = false;
  const int64_t block_size = PositiveIntKey(config, "block_size", &bad);
  if (bad || block_size == 0) return Refuse(config_name, "block_size", "must be an integer > 0");
  if (block_size > 0 && b.block_length() != block_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_diffusion.block_length = ", b.block_length(),
        " disagrees with block_size = ", block_size, " in ", config_name,
        ", the block length this SDAR checkpoint was trained with; leave block_length out to use "
        "it, or change block_size in config.json to train a new one"));
  }
  const int64_t mask = PositiveIntKey(config, "mask_token_id", &bad);
  if (bad) return Refuse(config_name, "mask_token_id", "must be a token id, an integer >= 0");
  if (mask >= 0 && b.has_mask_token_id() && b.mask_token_id() != mask) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block_diffusion.mask_token_id = ", b.mask_token_id(), " disagrees with mask_token_id = ",
        mask, " in ", config_name, "; leave it out of the spec to use the checkpoint's"));
  }

  for (const char* key : {"fuse_cross_entropy", "enable_block_generation"}) {
    const auto it = config.find(key);
    if (it != config.end() && !it->is_null() && !it->is_boolean()) {
      return Refuse(config_name, key, "must be true or false");
    }
  }
  if (const auto it = config.find("use_regular_causal");
      it != config.end() && !it->is_null() && (!it->is_boolean() || it->get<bool>())) {
    return Refuse(config_name, "use_regular_causal",
                  "must be false or absent: true makes attention token-causal outside the "
                  "noised block, which is not the block-diffusion mask Ballast trains");
  }
  if (const auto it = config.find("architectures"); it != config.end() && !it->is_null()) {
    const std::string sdar = moe ? "SDARMoeForCausalLM" : "SDARForCausalLM";
    const std::string qwen3 = moe ? "Qwen3MoeForCausalLM" : "Qwen3ForCausalLM";
    const bool known = it->is_array() && std::all_of(it->begin(), it->end(), [&](const auto& a) {
                         return a == sdar || a == qwen3;
                       });
    if (!known) {
      return Refuse(
          config_name, "architectures",
          absl::StrCat("must be [\"", sdar, "\"], got ", it->dump(),
                       moe ? "" : " (SDAR's mixture of experts has model_type sdar_moe)"));
    }
  }
  if (const auto it = config.find("layer_types"); it != config.end() && !it->is_null()) {
    const bool full = it->is_array() && std::all_of(it->begin(), it->end(), [](const auto& t) {
                        return t == "full_attention";
                      });
    if (!full) {
      return Refuse(config_name, "layer_types",
                    "must list only \"full_attention\" (sliding-window layers are not supported)");
    }
  }
  return absl::OkStatus();
}

}  // namespace ballast
