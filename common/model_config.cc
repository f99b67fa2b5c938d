#include "common/model_config.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

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

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("config.json is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("config.json must be a JSON object");
  const Fields f(root, "");
  ModelConfig c;

  std::optional<std::string> model_type;
  BALLAST_ASSIGN_OR_RETURN(model_type, f.OptionalString("model_type"));
  if (!model_type) {
    return Invalid("model_type",
                   absl::StrCat("is required (one of ", SupportedModelTypesText(), ")"));
  }
  if (!IsSupportedModelType(*model_type)) {
    return Invalid("model_type", absl::StrCat("must be one of ", SupportedModelTypesText(),
                                              "; got \"", *model_type, "\""));
  }
  c.model_type = *model_type;

  BALLAST_ASSIGN_OR_RETURN(c.vocab_size, f.PositiveInt("vocab_size", kMaxVocab));
  BALLAST_ASSIGN_OR_RETURN(c.hidden_size, f.PositiveInt("hidden_size", kMaxWidth));
  BALLAST_ASSIGN_OR_RETURN(c.intermediate_size, f.PositiveInt("intermediate_size", kMaxWidth));
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
    return Invalid("num_key_value_heads",
                   absl::StrCat("must divide num_attention_heads (", c.num_attention_heads,
                                "), got ", c.num_key_value_heads));
  }

  if (f.Find("head_dim") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.head_dim, f.PositiveInt("head_dim", kMaxWidth));
  } else if (c.hidden_size % c.num_attention_heads != 0) {
    return Invalid("head_dim",
                   absl::StrCat("is required when num_attention_heads (", c.num_attention_heads,
                                ") does not divide hidden_size (", c.hidden_size, ")"));
  } else {
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  // RoPE rotates pairs of channels, and the attention kernels stop at 256.
  if (c.head_dim % 2 != 0 || c.head_dim > kMaxHeadDim) {
    return Invalid("head_dim",
                   absl::StrCat("must be even and <= ", kMaxHeadDim, ", got ", c.head_dim));
  }

  if (f.Find("rms_norm_eps") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(c.rms_norm_eps, f.PositiveDouble("rms_norm_eps"));
  }

  // transformers 5 moves rope_theta and the scaling into rope_parameters;
  // older configs have rope_theta and rope_scaling at the top level.
  std::optional<double> theta;
  std::optional<double> nested_theta;
  if (f.Find("rope_theta") != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(theta, f.PositiveDouble("rope_theta"));
  }
  const json* rope_parameters = f.Find("rope_parameters");
  const json* rope_scaling = f.Find("rope_scaling");
  if (rope_parameters != nullptr && rope_parameters->is_object()) {
    const Fields p(*rope_parameters, "rope_parameters.");
    if (p.Find("rope_theta") != nullptr) {
      BALLAST_ASSIGN_OR_RETURN(nested_theta, p.PositiveDouble("rope_theta"));
    }
  }
  if (theta && nested_theta && *theta != *nested_theta) {
    return Invalid("rope_theta", absl::StrCat("(", *theta, ") disagrees with rope_parameters.",
                                              "rope_theta (", *nested_theta, ")"));
  }
  if (theta) c.rope_theta = *theta;
  if (nested_theta) c.rope_theta = *nested_theta;

  if (rope_scaling != nullptr) {
    BALLAST_ASSIGN_OR_RETURN(
        c.rope_scaling, ParseRopeScaling(*rope_scaling, "rope_scaling", c.max_position_embeddings));
  }
  if (rope_parameters != nullptr) {
    RopeScaling from_parameters;
    BALLAST_ASSIGN_OR_RETURN(from_parameters, ParseRopeScaling(*rope_parameters, "rope_parameters",
                                                               c.max_position_embeddings));
    if (rope_scaling != nullptr && !SameRope(c.rope_scaling, from_parameters)) {
      return Invalid("rope_scaling", "disagrees with rope_parameters");
    }
    c.rope_scaling = from_parameters;
  }

  std::optional<std::string> hidden_act;
  BALLAST_ASSIGN_OR_RETURN(hidden_act, f.OptionalString("hidden_act"));
  if (hidden_act && *hidden_act != "silu") {
    return Invalid("hidden_act", absl::StrCat("must be \"silu\", got \"", *hidden_act, "\""));
  }

  std::optional<bool> flag;
  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("tie_word_embeddings"));
  c.tie_word_embeddings = flag.value_or(false);

  // Qwen2's attention has q/k/v biases unconditionally; transformers ignores
  // the key for it, so we do too.
  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("attention_bias"));
  c.attention_bias = c.model_type == "qwen2" || flag.value_or(false);

  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("mlp_bias"));
  if (flag.value_or(false))
    return Invalid("mlp_bias", "must be false (MLP biases are not supported)");

  BALLAST_ASSIGN_OR_RETURN(flag, f.OptionalBool("use_sliding_window"));
  if (flag.value_or(false))
    return Invalid("use_sliding_window", "is not supported (must be false)");

  // The decoder has no attention dropout; a nonzero value would be ignored.
  std::optional<double> dropout;
  BALLAST_ASSIGN_OR_RETURN(dropout, f.OptionalDouble("attention_dropout"));
  if (dropout.value_or(0.0) != 0.0) {
    return Invalid("attention_dropout", absl::StrCat("must be 0, got ", *dropout));
  }

  // SDAR's decoder is Qwen3's (common/sdar_checkpoint.h checks its own keys).
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "sdar";
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
