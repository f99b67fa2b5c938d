#include "common/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model_types.h"
#include "common/regular_file.h"

namespace ballast {
namespace {

using json = nlohmann::json;

constexpr int64_t kMaxHeadDim = 256;
// Bounds far past the largest open models (Llama 3.1 405B: 126 layers,
// hidden 16384, 53248 intermediate, 128 heads; vocabularies up to 262k;
// contexts up to 10M tokens).
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 26;

absl::Status Invalid(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(key, " ", what));
}

// Typed lookups on one JSON object. `prefix` qualifies nested keys in errors
// ("rope_scaling.factor"). An absent key and an explicit null both read as
// unset, the way transformers treats them.
class Fields {
 public:
  Fields(const json& object, std::string prefix) : object_(object), prefix_(std::move(prefix)) {}

  std::string Name(const std::string& key) const { return absl::StrCat(prefix_, key); }

  const json* Find(const std::string& key) const {
    const auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::StatusOr<std::optional<int64_t>> OptionalInt(const std::string& key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() &&
         v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
      return Invalid(Name(key), absl::StrCat("must be an integer, got ", v->dump()));
    }
    return v->get<int64_t>();
  }

  absl::StatusOr<std::optional<double>> OptionalDouble(const std::string& key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_number())
      return Invalid(Name(key), absl::StrCat("must be a number, got ", v->dump()));
    return v->get<double>();
  }

  absl::StatusOr<std::optional<bool>> OptionalBool(const std::string& key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_boolean())
      return Invalid(Name(key), absl::StrCat("must be a boolean, got ", v->dump()));
    return v->get<bool>();
  }

  absl::StatusOr<std::optional<std::string>> OptionalString(const std::string& key) const {
    const json* v = Find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string())
      return Invalid(Name(key), absl::StrCat("must be a string, got ", v->dump()));
    return v->get<std::string>();
  }

  // A required integer > 0.
  // A required integer in [1, max]. The bound is far past any real model;
  // without it a corrupt value (num_hidden_layers: 10^9) would keep the
  // loader busy for minutes before memory runs out.
  absl::StatusOr<int64_t> PositiveInt(const std::string& key, int64_t max) const {
    absl::StatusOr<std::optional<int64_t>> v = OptionalInt(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return Invalid(Name(key), "is required (an integer > 0)");
    if (**v <= 0) return Invalid(Name(key), absl::StrCat("must be > 0, got ", **v));
    if (**v > max) {
      return Invalid(Name(key), absl::StrCat("must be at most ", max, ", got ", **v,
                                             " (larger than any model; is config.json corrupt?)"));
    }
    return **v;
  }

  // A required finite number > 0.
  absl::StatusOr<double> PositiveDouble(const std::string& key) const {
    absl::StatusOr<std::optional<double>> v = OptionalDouble(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return Invalid(Name(key), "is required (a number > 0)");
    if (!std::isfinite(**v) || **v <= 0) {
      return Invalid(Name(key), absl::StrCat("must be a finite number > 0, got ", **v));
    }
    return **v;
  }

 private:
  const json& object_;
  std::string prefix_;
};

// Unwraps an absl::StatusOr into `lhs`, or returns its error from the caller.
#define BALLAST_ASSIGN_OR_RETURN(lhs, expr)         \
  do {                                              \
    auto status_or = (expr);                        \
    if (!status_or.ok()) return status_or.status(); \
    lhs = *std::move(status_or);                    \
  } while (0)

// Parses one rope_scaling (or transformers 5's rope_parameters) object.
absl::StatusOr<RopeScaling> ParseRopeScaling(const json& object, const std::string& key,
                                             int64_t max_position_embeddings) {
  if (!object.is_object()) {
    return Invalid(key, absl::StrCat("must be null or an object, got ", object.dump()));
  }
  const Fields f(object, key + ".");
  std::optional<std::string> rope_type;
  std::optional<std::string> legacy_type;
  BALLAST_ASSIGN_OR_RETURN(rope_type, f.OptionalString("rope_type"));
  BALLAST_ASSIGN_OR_RETURN(legacy_type, f.OptionalString("type"));
  if (rope_type && legacy_type && *rope_type != *legacy_type) {
    return Invalid(key, absl::StrCat("has rope_type \"", *rope_type, "\" and type \"", *legacy_type,
                                     "\"; they must agree"));
  }
  if (!rope_type) rope_type = legacy_type;
  if (!rope_type) {
    return Invalid(f.Name("rope_type"), "is required (one of default, linear, llama3)");
  }

  RopeScaling rs;
  rs.type = *rope_type;
  if (rs.type == "default") return rs;
  if (rs.type != "linear" && rs.type != "llama3") {
    return Invalid(f.Name("rope_type"),
                   absl::StrCat("must be one of default, linear, llama3; got \"", rs.type, "\""));
  }
  BALLAST_ASSIGN_OR_RETURN(rs.factor, f.PositiveDouble("factor"));
  if (rs.type == "linear") return rs;

  BALLAST_ASSIGN_OR_RETURN(rs.low_freq_factor, f.PositiveDouble("low_freq_factor"));
  BALLAST_ASSIGN_OR_RETURN(rs.high_freq_factor, f.PositiveDouble("high_freq_factor"));
  // The llama3 ramp divides by (high - low).
  if (rs.high_freq_factor <= rs.low_freq_factor) {
    return Invalid(f.Name("high_freq_factor"),
                   absl::StrCat("must be > low_freq_factor (", rs.low_freq_factor, "), got ",
                                rs.high_freq_factor));
  }
  BALLAST_ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                           f.PositiveInt("original_max_position_embeddings", kMaxPositions));
  if (rs.original_max_position_embeddings > max_position_embeddings) {
    return Invalid(f.Name("original_max_position_embeddings"),
                   absl::StrCat("must be <= max_position_embeddings (", max_position_embeddings,
                                "), got ", rs.original_max_position_embeddings));
  }
  return rs;
}

bool SameRope(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings;
}

// Qwen3.5's decoder (the VLM's text_config, or the text model alone), with
// dense MLPs or with experts.
bool IsQwen35(const std::string& model_type) {
  return model_type == "qwen3_5" || model_type == "qwen3_5_text" || model_type == "qwen3_5_moe" ||
         model_type == "qwen3_5_moe_text";
}

// The families whose MLPs are mixtures of experts.
bool HasMoeLayers(const std::string& model_type) {
  return model_type == "qwen3_moe" || model_type == "sdar_moe" || model_type == "qwen3_5_moe" ||
         model_type == "qwen3_5_moe_text";
}

// layer_types, or Qwen3.5's default from full_attention_interval: layer i is
// full attention when (i + 1) % interval == 0. The dense families accept only
// full_attention entries (transformers 4.57 writes them for Qwen2/Qwen3).
absl::StatusOr<std::vector<TokenMixer>> ParseLayerTypes(const Fields& f, int64_t layers,
                                                        bool hybrid) {
  std::vector<TokenMixer> types(layers, TokenMixer::kAttention);
  const json* given = f.Find("layer_types");
  if (given == nullptr) {
    if (!hybrid) return types;
    int64_t interval = 4;
    if (f.Find("full_attention_interval") != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(interval, f.PositiveInt("full_attention_interval", kMaxLayers));
    }
    for (int64_t i = 0; i < layers; ++i) {
      if ((i + 1) % interval != 0) types[i] = TokenMixer::kGatedDeltaNet;
    }
    return types;
  }
  const std::string allowed = hybrid ? "full_attention, linear_attention" : "full_attention";
  if (!given->is_array() || static_cast<int64_t>(given->size()) != layers) {
    return Invalid(f.Name("layer_types"),
                   absl::StrCat("must be a list of num_hidden_layers (", layers,
                                ") layer types, got ", given->dump()));
  }
  for (int64_t i = 0; i < layers; ++i) {
    const json& entry = (*given)[i];
    const std::string key = absl::StrCat(f.Name("layer_types"), "[", i, "]");
    if (entry.is_string() && entry.get<std::string>() == "full_attention") continue;
    if (hybrid && entry.is_string() && entry.get<std::string>() == "linear_attention") {
      types[i] = TokenMixer::kGatedDeltaNet;
      continue;
    }
    return Invalid(key, absl::StrCat("must be one of ", allowed, "; got ", entry.dump()));
  }
  return types;
}

// The linear_* keys, with transformers 5.23's Qwen3_5TextConfig defaults for
// absent ones (config.json files it saves always have them).
absl::StatusOr<GatedDeltaNetConfig> ParseGatedDeltaNet(const Fields& f) {
  GatedDeltaNetConfig g;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"linear_num_key_heads", &g.num_key_heads}, {"linear_num_value_heads", &g.num_value_heads},
      {"linear_key_head_dim", &g.key_head_dim},   {"linear_value_head_dim", &g.value_head_dim},
      {"linear_conv_kernel_dim", &g.conv_kernel},
  };
  const int64_t defaults[] = {16, 32, 128, 128, 4};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    *sizes[i].second = defaults[i];
    if (f.Find(sizes[i].first) != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(*sizes[i].second, f.PositiveInt(sizes[i].first, kMaxHeads));
    }
  }
  if (g.num_value_heads % g.num_key_heads != 0) {
    return Invalid(f.Name("linear_num_value_heads"),
                   absl::StrCat("must be a multiple of linear_num_key_heads (", g.num_key_heads,
                                "), got ", g.num_value_heads,
                                " (each value head reads key head h / (value heads / key heads))"));
  }
  if (g.key_head_dim > kMaxHeadDim || g.value_head_dim > kMaxHeadDim) {
    return Invalid(
        f.Name(g.key_head_dim > kMaxHeadDim ? "linear_key_head_dim" : "linear_value_head_dim"),
        absl::StrCat("must be <= ", kMaxHeadDim));
  }
  return g;
}

// A mixture-of-experts config: the decoder has dense MLPs only, so one that
// asks for experts is refused rather than run without them.
absl::Status RefuseExperts(const Fields& f) {
  for (const char* key :
       {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok",
        "moe_intermediate_size", "shared_expert_intermediate_size"}) {
    absl::StatusOr<std::optional<int64_t>> v = f.OptionalInt(key);
    if (!v.ok()) return v.status();
    if (v->value_or(0) > 0) {
      return Invalid(f.Name(key),
                     absl::StrCat("is ", **v,
                                  ": mixture-of-experts layers are not supported "
                                  "(the decoder's MLPs are dense); must be 0 or absent"));
    }
  }
  return absl::OkStatus();
}

// The mixture-of-experts keys, with the defaults of transformers 4.57.6's
// Qwen3MoeConfig for absent ones, or of 5.23's Qwen3_5MoeTextConfig when
// `qwen3_5` (which adds shared_expert_intermediate_size).
absl::StatusOr<MoeConfig> ParseExperts(const Fields& f, int64_t layers, bool qwen3_5) {
  MoeConfig m;
  const std::pair<const char*, int64_t*> sizes[] = {
      {"num_experts", &m.num_experts},
      {"num_experts_per_tok", &m.top_k},
      {"moe_intermediate_size", &m.moe_intermediate_size},
      {"decoder_sparse_step", &m.decoder_sparse_step},
      {"shared_expert_intermediate_size", &m.shared_expert_intermediate_size},
  };
  const int64_t defaults[] = {qwen3_5 ? 256 : 128, 8, qwen3_5 ? 512 : 768, 1, qwen3_5 ? 512 : 0};
  for (size_t i = 0; i < std::size(sizes); ++i) {
    *sizes[i].second = defaults[i];
    if (f.Find(sizes[i].first) != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(*sizes[i].second, f.PositiveInt(sizes[i].first, kMaxWidth));
    }
  }
  // Qwen3-MoE has no shared expert; a config that asks for one is another model.
  if (!qwen3_5 && m.shared_expert_intermediate_size > 0) {
    return Invalid(f.Name("shared_expert_intermediate_size"),
                   "is not supported for this model_type (Qwen3-MoE has no shared expert); must "
                   "be absent");
  }
  if (m.top_k > m.num_experts) {
    return Invalid(f.Name("num_experts_per_tok"),
                   absl::StrCat("must be <= num_experts (", m.num_experts, "), got ", m.top_k));
  }
  if (const json* only = f.Find("mlp_only_layers"); only != nullptr) {
    if (!only->is_array()) {
      return Invalid(f.Name("mlp_only_layers"),
                     absl::StrCat("must be a list of layer indices, got ", only->dump()));
    }
    for (const json& entry : *only) {
      if (!entry.is_number_integer() || entry.get<int64_t>() < 0 ||
          entry.get<int64_t>() >= layers) {
        return Invalid(f.Name("mlp_only_layers"), absl::StrCat("must hold layer indices in 0..",
                                                               layers - 1, ", got ", entry.dump()));
      }
      m.mlp_only_layers.push_back(entry.get<int64_t>());
    }
  }
  std::optional<bool> norm;
  BALLAST_ASSIGN_OR_RETURN(norm, f.OptionalBool("norm_topk_prob"));
  m.norm_topk_prob = norm.value_or(false);
  std::optional<double> coef;
  BALLAST_ASSIGN_OR_RETURN(coef, f.OptionalDouble("router_aux_loss_coef"));
  m.router_aux_loss_coef = coef.value_or(0.001);
  if (!std::isfinite(m.router_aux_loss_coef) || m.router_aux_loss_coef < 0) {
    return Invalid(f.Name("router_aux_loss_coef"),
                   absl::StrCat("must be a finite number >= 0, got ", m.router_aux_loss_coef));
  }
  // Accepted and not read (MoeConfig::router_aux_loss_coef says why); its type is checked.
  std::optional<bool> output_router_logits;
  BALLAST_ASSIGN_OR_RETURN(output_router_logits, f.OptionalBool("output_router_logits"));
  return m;
}

}  // namespace

bool MoeConfig::sparse(int64_t layer) const {
  return num_experts > 0 &&
         std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) ==
             mlp_only_layers.end() &&
         (layer + 1) % decoder_sparse_step == 0;
}

bool ModelConfig::has_experts() const {
  for (int64_t i = 0; i < num_hidden_layers; ++i) {
    if (moe.sparse(i)) return true;
  }
  return false;
}

bool ModelConfig::has_linear_attention() const {
  for (TokenMixer m : layer_types) {
    if (m == TokenMixer::kGatedDeltaNet) return true;
  }
  return false;
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json must be a JSON object");
  const Fields top(root, "");
  ModelConfig c;

  std::optional<std::string> model_type;
  BALLAST_ASSIGN_OR_RETURN(model_type, top.OptionalString("model_type"));
  if (!model_type) {
    return Invalid("model_type",
                   absl::StrCat("is required (one of ", SupportedModelTypesText(), ")"));
  }
  if (!IsSupportedModelType(*model_type)) {
    return Invalid("model_type", absl::StrCat("must be one of ", SupportedModelTypesText(),
                                              "; got \"", *model_type, "\""));
  }
  c.model_type = *model_type;
  const bool qwen3_5 = IsQwen35(c.model_type);

  // The decoder's keys: the root, or the vision-language wrapper's text_config.
  const std::string text_key(TextConfigKey(c.model_type));
  const json* text = &root;
  if (!text_key.empty()) {
    text = top.Find(text_key);
    if (text == nullptr || !text->is_object()) {
      return Invalid(text_key, "is required (an object with the text decoder's keys)");
    }
    c.tensor_prefix = "model.language_model.";
  }
  const Fields f(*text, text_key.empty() ? "" : text_key + ".");
  if (!text_key.empty()) {
    // The wrapper's text_config is its text model's config.
    const std::string text_type = c.model_type + "_text";
    std::optional<std::string> inner;
    BALLAST_ASSIGN_OR_RETURN(inner, f.OptionalString("model_type"));
    if (inner && *inner != text_type) {
      return Invalid(f.Name("model_type"),
                     absl::StrCat("must be \"", text_type, "\", got \"", *inner, "\""));
    }
  }
  const bool moe = HasMoeLayers(c.model_type);

  BALLAST_ASSIGN_OR_RETURN(c.vocab_size, f.PositiveInt("vocab_size", kMaxVocab));
  BALLAST_ASSIGN_OR_RETURN(c.hidden_size, f.PositiveInt("hidden_size", kMaxWidth));
  // Qwen3.5-MoE has no dense layer, and its config no intermediate_size;
  // one that is there is checked and not read.
  if (!(moe && qwen3_5) || f.Find("intermediate_size") != nullptr) {
    int64_t width = 0;
    BALLAST_ASSIGN_OR_RETURN(width, f.PositiveInt("intermediate_size", kMaxWidth));
    if (!(moe && qwen3_5)) c.intermediate_size = width;
  }
  BALLAST_ASSIGN_OR_RETURN(c.num_hidden_layers, f.PositiveInt("num_hidden_layers", kMaxLayers));
  BALLAST_ASSIGN_OR_RETURN(c.num_attention_heads, f.PositiveInt("num_attention_heads", kMaxHeads));
  BALLAST_ASSIGN_OR_RETURN(c.max_position_embeddings,
                           f.PositiveInt("max_position_embeddings", kMaxPositions));

  if (f.Find("num_key_value_heads") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.num_key_value_heads,
                             f.PositiveInt("num_key_value_heads", kMaxHeads));
  } else {
    c.num_key_value_heads = c.num_attention_heads;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Invalid(f.Name("num_key_value_heads"),
                   absl::StrCat("must divide num_attention_heads (", c.num_attention_heads,
                                "), got ", c.num_key_value_heads));
  }

  if (f.Find("head_dim") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.head_dim, f.PositiveInt("head_dim", kMaxWidth));
  } else if (qwen3_5) {
    c.head_dim = 256;  // Qwen3_5TextConfig's default
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    return Invalid(f.Name("head_dim"),
                   absl::StrCat("is required when num_attention_heads (", c.num_attention_heads,
                                ") does not divide hidden_size (", c.hidden_size, ")"));
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // RoPE rotates pairs of channels, and the attention kernels stop at 256.
  if (c.head_dim % 2 != 0 || c.head_dim > kMaxHeadDim) {
    return Invalid(f.Name("head_dim"),
                   absl::StrCat("must be even and <= ", kMaxHeadDim, ", got ", c.head_dim));
  }

  if (f.Find("rms_norm_eps") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.rms_norm_eps, f.PositiveDouble("rms_norm_eps"));
  }

  // transformers 5 moves rope_theta, partial_rotary_factor and the scaling
  // into rope_parameters; older configs have them at the top level.
  std::optional<double> theta;
  std::optional<double> nested_theta;
  std::optional<double> factor;
  std::optional<double> nested_factor;
  if (f.Find("rope_theta") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(theta, f.PositiveDouble("rope_theta"));
  }
  if (f.Find("partial_rotary_factor") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(factor, f.PositiveDouble("partial_rotary_factor"));
  }
  const json* rope_parameters = f.Find("rope_parameters");
  const json* rope_scaling = f.Find("rope_scaling");
  if (rope_parameters != nullptr && rope_parameters->is_object()) {
    const Fields p(*rope_parameters, f.Name("rope_parameters."));
    if (p.Find("rope_theta") != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(nested_theta, p.PositiveDouble("rope_theta"));
    }
    if (p.Find("partial_rotary_factor") != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(nested_factor, p.PositiveDouble("partial_rotary_factor"));
    }
  }
  if (theta && nested_theta && *theta != *nested_theta) {
    return Invalid(f.Name("rope_theta"),
                   absl::StrCat("(", *theta, ") disagrees with rope_parameters.", "rope_theta (",
                                *nested_theta, ")"));
  }
  if (theta) c.rope_theta = *theta;
  if (nested_theta) c.rope_theta = *nested_theta;
  if (factor && nested_factor && *factor != *nested_factor) {
    return Invalid(f.Name("partial_rotary_factor"),
                   absl::StrCat("(", *factor, ") disagrees with rope_parameters.",
                                "partial_rotary_factor (", *nested_factor, ")"));
  }
  // Qwen3_5TextConfig defaults it to 0.25; elsewhere RoPE covers the head.
  const double rotary_factor = nested_factor.value_or(factor.value_or(qwen3_5 ? 0.25 : 1.0));
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * rotary_factor);
  if (c.rotary_dim < 2 || c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim) {
    return Invalid(
        f.Name(nested_factor ? "rope_parameters.partial_rotary_factor" : "partial_rotary_factor"),
        absl::StrCat("gives a rotary dimension of ", c.rotary_dim, " (head_dim ", c.head_dim, " x ",
                     rotary_factor, "); it must be even and in 2..head_dim"));
  }

  if (rope_scaling != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(*rope_scaling, f.Name("rope_scaling"),
                                                              c.max_position_embeddings));
  }
  if (rope_parameters != nullptr) {
    RopeScaling from_parameters;
    BALLAST_ASSIGN_OR_RETURN(
        from_parameters,
        ParseRopeScaling(*rope_parameters, f.Name("rope_parameters"), c.max_position_embeddings));
    if (rope_scaling != nullptr && !SameRope(c.rope_scaling, from_parameters)) {
      return Invalid(f.Name("rope_scaling"), "disagrees with rope_parameters");
    }
    c.rope_scaling = from_parameters;
  }

  std::optional<std::string> hidden_act;
  BALLAST_ASSIGN_OR_RETURN(hidden_act, f.OptionalString("hidden_act"));
  if (hidden_act && *hidden_act != "silu") {
    return Invalid(f.Name("hidden_act"),
                   absl::StrCat("must be \"silu\", got \"", *hidden_act, "\""));
  }

  std::optional<bool> flag;
  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = flag.value_or(false);
  if (!text_key.empty()) {
    // transformers ties the wrapper's lm_head by the wrapper's own key;
    // text_config's stands in only when the wrapper has none.
    std::optional<bool> outer;
    BALLAST_ASSIGN_OR_RETURN(outer, top.OptionalBool("tie_word_embeddings"));
    if (outer) c.tie_word_embeddings = *outer;
  }

  // Qwen2's attention has q/k/v biases unconditionally; transformers ignores
  // the key for it, so we do too.
  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("attention_bias"));
  c.attention_bias = c.model_type == "qwen2" || flag.value_or(false);
  if (qwen3_5 && c.attention_bias) {
    return Invalid(f.Name("attention_bias"),
                   "must be false for Qwen3.5 (its o_proj bias is not supported)");
  }

  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("mlp_bias"));
  if (flag.value_or(false))
    return Invalid(f.Name("mlp_bias"), "must be false (MLP biases are not supported)");

  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("use_sliding_window"));
  if (flag.value_or(false))
    return Invalid(f.Name("use_sliding_window"), "is not supported (must be false)");

  // The decoder has no attention dropout; a nonzero value would be ignored.
  std::optional<double> dropout;
  BALLAST_ASSIGN_OR_RETURN(dropout, f.OptionalDouble("attention_dropout"));
  if (dropout.value_or(0.0) != 0.0) {
    return Invalid(f.Name("attention_dropout"), absl::StrCat("must be 0, got ", *dropout));
  }

  if (moe) {
    BALLAST_ASSIGN_OR_RETURN(c.moe, ParseExperts(f, c.num_hidden_layers, qwen3_5));
    // SDAR's engine (common/sdar_checkpoint.h) and transformers 5.23's
    // Qwen3_5MoeTopKRouter always renormalise the top-k weights, and neither
    // has dense layers among sparse ones: keys that would say otherwise are
    // refused rather than ignored.
    if (c.model_type != "qwen3_moe") {
      const std::string why =
          c.model_type == "sdar_moe"
              ? "for sdar_moe (SDAR's engine "
              : absl::StrCat("for ", c.model_type, " (transformers' Qwen3.5-MoE ");
      std::optional<bool> norm;
      BALLAST_ASSIGN_OR_RETURN(norm, f.OptionalBool("norm_topk_prob"));
      if (!norm.value_or(true)) {
        return Invalid(f.Name("norm_topk_prob"), absl::StrCat("must be true or absent ", why,
                                                              "renormalises the top-k weights)"));
      }
      c.moe.norm_topk_prob = true;
      if (!c.moe.mlp_only_layers.empty()) {
        return Invalid(f.Name("mlp_only_layers"),
                       absl::StrCat("must be empty ", why, "does not read it)"));
      }
      if (qwen3_5 && c.moe.decoder_sparse_step != 1) {
        return Invalid(f.Name("decoder_sparse_step"),
                       absl::StrCat("must be 1 or absent ", why, "does not read it)"));
      }
    }
  } else if (absl::Status s = RefuseExperts(f); !s.ok()) {
    return s;
  }
  BALLAST_ASSIGN_OR_RETURN(c.layer_types, ParseLayerTypes(f, c.num_hidden_layers, qwen3_5));

  if (qwen3_5) {
    // transformers 5.23's Qwen3.5 always gates the attention output and has
    // no key for it; a config that turns the gate off asks for another model.
    BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("attn_output_gate"));
    if (!flag.value_or(true)) {
      return Invalid(f.Name("attn_output_gate"),
                     "is false, which this decoder does not implement (Qwen3.5's attention "
                     "output is always gated); must be true or absent");
    }
    c.attention_output_gate = true;
    c.zero_centred_norm = true;
    c.qk_norm = true;
    if (c.has_linear_attention()) {
      BALLAST_ASSIGN_OR_RETURN(c.linear_attention, ParseGatedDeltaNet(f));
    }
    return c;
  }

  // SDAR's decoder is Qwen3's (common/sdar_checkpoint.h checks its own keys),
  // and Qwen3-MoE's attention is too.
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "sdar" || c.model_type == "qwen3_moe" ||
              c.model_type == "sdar_moe";
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxConfigJsonBytes);
  if (!text.ok()) return text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*std::move(text));
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

#undef BALLAST_ASSIGN_OR_RETURN

}  // namespace ballast
