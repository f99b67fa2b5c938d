#include "worker/train/model/lora.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/regular_file.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// PEFT prefixes every key of a causal LM with the wrapper's path.
constexpr char kPeftPrefix[] = "base_model.model.";

// Every linear module a decoder may have, by short name: softmax attention's,
// Gated DeltaNet's, the MLP's, Qwen3.5-MoE's shared-expert gate. "all-linear"
// is all of them (PEFT's meaning: every nn.Linear but the output head; the
// router, an nn.Linear in transformers 4.57's Qwen3-MoE, is left out); a
// layer adapts those it has.
const std::vector<std::string>& LinearModules() {
  static const std::vector<std::string> kModules = {"q_proj",
                                                    "k_proj",
                                                    "v_proj",
                                                    "o_proj",
                                                    "in_proj_qkv",
                                                    "in_proj_z",
                                                    "in_proj_b",
                                                    "in_proj_a",
                                                    "out_proj",
                                                    "gate_proj",
                                                    "up_proj",
                                                    "down_proj",
                                                    "shared_expert_gate"};
  return kModules;
}

// One linear module of a layer that LoRA can adapt: its short name (what
// target_modules names), its ParamStore path (to which ".lora_A.weight" is
// appended), its (out, in), whether it is a sparse layer's stacked experts
// (an A and B per expert, expert_layout.h), and for a parameter that PEFT
// reaches by target_parameters instead, its name under the layer's "mlp.".
struct LayerLinear {
  std::string short_name;
  std::string path;
  int64_t out = 0;
  int64_t in = 0;
  bool stacked = false;
  std::string parameter;
};

bool Targeted(const LoraConfig& lora, const LayerLinear& m) {
  return m.parameter.empty() ? lora.targets(m.short_name) : lora.targets_parameter(m.parameter);
}

// Qwen3.5-MoE, the one family here with a shared expert, is transformers
// 5.23's: its router (Qwen3_5MoeTopKRouter) and its fused routed experts (3-D
// parameters of one module) are not nn.Linear modules, so PEFT reaches them
// only by target_parameters.
bool ExpertsAreParameters(const ModelConfig& c) {
  return c.moe.shared_expert_intermediate_size > 0;
}

constexpr char kGateUpParameter[] = "experts.gate_up_proj";
constexpr char kDownParameter[] = "experts.down_proj";
constexpr char kRouterParameter[] = "gate.weight";

// A layer's linear modules in PEFT's order (the order of the HF module tree:
// transformers registers Gated DeltaNet's out_proj before its in_proj_*, a
// sparse MLP's router before its experts, and a shared expert before its
// gate).
std::vector<LayerLinear> LayerLinears(const ModelConfig& c, int64_t layer) {
  const std::string p = LayerPrefix(layer);
  const int64_t h = c.hidden_size;
  std::vector<LayerLinear> out;
  if (c.layer_types[layer] == TokenMixer::kGatedDeltaNet) {
    const GatedDeltaNetConfig& g = c.linear_attention;
    const std::string a = p + "linear_attn.";
    out = {{"out_proj", a + "out_proj", h, g.value_dim()},
           {"in_proj_qkv", a + "in_proj_qkv", g.conv_dim(), h},
           {"in_proj_z", a + "in_proj_z", g.value_dim(), h},
           {"in_proj_b", a + "in_proj_b", g.num_value_heads, h},
           {"in_proj_a", a + "in_proj_a", g.num_value_heads, h}};
  } else {
    const int64_t q = c.num_attention_heads * c.head_dim;
    const int64_t kv = c.num_key_value_heads * c.head_dim;
    const std::string a = p + "self_attn.";
    out = {{"q_proj", a + "q_proj", c.attention_output_gate ? 2 * q : q, h},
           {"k_proj", a + "k_proj", kv, h},
           {"v_proj", a + "v_proj", kv, h},
           {"o_proj", a + "o_proj", h, q}};
  }
  // A SwiGLU MLP of `width` under `prefix`.
  auto mlp = [&](const std::string& prefix, int64_t width, bool stacked) {
    out.push_back({"gate_proj", prefix + "gate_proj", width, h, stacked});
    out.push_back({"up_proj", prefix + "up_proj", width, h, stacked});
    out.push_back({"down_proj", prefix + "down_proj", h, width, stacked});
  };
  if (!c.moe.sparse(layer)) {
    mlp(p + "mlp.", c.intermediate_size, false);
    return out;
  }
  if (ExpertsAreParameters(c)) {
    // Qwen3.5-MoE as PEFT sees transformers 5.23's module tree: the router
    // and the fused experts are target_parameters (gate and up share an A
    // there: gate_up_proj is one parameter), and target_modules reaches only
    // the shared expert and its gate, so gate_proj / up_proj / down_proj name
    // the shared expert's.
    const std::string experts = ExpertsPrefix(layer);
    const int64_t width = c.moe.moe_intermediate_size;
    out.push_back({"gate", p + "mlp.gate", c.moe.num_experts, h, false, kRouterParameter});
    out.push_back({"gate_up_proj", experts + "gate_up_proj", 2 * width, h, true, kGateUpParameter});
    out.push_back({"down_proj", experts + "down_proj", h, width, true, kDownParameter});
    mlp(p + "mlp.shared_expert.", c.moe.shared_expert_intermediate_size, false);
    out.push_back({"shared_expert_gate", p + "mlp.shared_expert_gate", 1, h});
    return out;
  }
  out.push_back({"gate", p + "mlp.gate", c.moe.num_experts, h});
  mlp(ExpertsPrefix(layer), c.moe.moe_intermediate_size, true);
  return out;
}

// The targets that some layer of the model has, in name order: the modules
// (short names), or the parameters (as adapter_config.json lists them,
// "mlp." in front).
std::vector<std::string> ModelTargets(const ModelConfig& c, const LoraConfig& lora,
                                      bool parameters) {
  std::set<std::string> found;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    for (const LayerLinear& m : LayerLinears(c, layer)) {
      if (m.parameter.empty() == parameters || !Targeted(lora, m)) continue;
      found.insert(parameters ? "mlp." + m.parameter : m.short_name);
    }
  }
  return {found.begin(), found.end()};
}

// A routed expert's adapter of Qwen3.5-MoE in PEFT's file layout (its
// ParamWrapper, peft tuners/lora/layer.py): A is one (r·E, in) matrix with
// expert e's rows at [e·r, (e+1)·r), B one (out, r·E) with expert e's column
// j at j·E + e. A module's wrappers nest in its parameters' order, so with
// both targeted gate_up_proj's (the first) lies under "experts.base_layer.".
struct WrappedAdapter {
  std::string key;  // its checkpoint name, without PEFT's prefix
  bool is_b = false;
};

std::optional<WrappedAdapter> WrappedAdapterOf(const ModelConfig& c, const LoraConfig& lora,
                                               const std::string& name) {
  if (!ExpertsAreParameters(c)) return std::nullopt;
  const size_t at = name.find(".mlp.experts.");
  if (at == std::string::npos) return std::nullopt;
  const std::string experts = name.substr(0, at + std::string(".mlp.experts.").size());
  const std::string rest = name.substr(experts.size());
  const bool gate_up = absl::StartsWith(rest, "gate_up_proj.lora_");
  if (!gate_up && !absl::StartsWith(rest, "down_proj.lora_")) return std::nullopt;
  const bool nested = gate_up && lora.targets_parameter(kDownParameter);
  const std::string leaf = rest.substr(rest.find(".lora_") + 1);  // lora_A.weight
  return WrappedAdapter{CheckpointName(c, experts + (nested ? "base_layer." : "") + leaf),
                        leaf == "lora_B.weight"};
}

// The stacked adapter (E, r, in) or (E, out, r) in the wrapper's layout, and back.
at::Tensor WrappedToFile(const at::Tensor& stacked, bool is_b) {
  if (!is_b) return stacked.reshape({-1, stacked.size(2)});
  return stacked.permute({1, 2, 0}).reshape({stacked.size(1), -1});
}

at::Tensor WrappedFromFile(const at::Tensor& file, at::IntArrayRef shape, bool is_b) {
  if (!is_b) return file.reshape(shape).to(at::kFloat);
  return file.reshape({shape[1], shape[2], shape[0]})
      .permute({2, 0, 1})
      .to(at::kFloat)
      .contiguous();
}

std::string SaveTargetName(const std::string& short_name) {
  return short_name == "lm_head" ? "lm_head.weight" : "model.embed_tokens.weight";
}

// The adapter folder's adapter_config.json as a JSON object. Read without
// blocking and with a bound, as config.json is (common/regular_file.h).
absl::StatusOr<nlohmann::json> ReadAdapterConfig(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path.string(), kMaxConfigJsonBytes);
  if (absl::IsNotFound(text.status())) {
    return absl::NotFoundError(absl::StrCat("adapter config not found: ", path.string()));
  }
  if (!text.ok()) return text.status();
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not valid JSON"));
  }
  return j;
}

}  // namespace

double LoraConfig::scaling() const {
  return use_rslora ? lora_alpha / std::sqrt(static_cast<double>(r)) : lora_alpha / r;
}

LoraConfig LoraConfigFromSpec(const v1::LoraSpec& spec) {
  LoraConfig c;
  c.r = spec.r();
  c.lora_alpha = spec.lora_alpha();
  c.use_rslora = spec.use_rslora();
  c.lora_dropout = spec.lora_dropout();
  c.init_lora_weights = spec.init_lora_weights();
  for (const std::string& m : spec.target_modules()) {
    c.target_modules_as_given.push_back(m);
    if (m == "all-linear") {
      c.target_modules.insert(LinearModules().begin(), LinearModules().end());
    } else {
      c.target_modules.insert(m);
    }
  }
  // PEFT matches a target parameter by a suffix of its name; a name that is
  // none of these stays as written, for AddLoraAdapters to refuse.
  for (const std::string& p : spec.target_parameters()) {
    if (absl::EndsWith(p, "gate_up_proj")) {
      c.target_parameters.insert(kGateUpParameter);
    } else if (absl::EndsWith(p, "down_proj")) {
      c.target_parameters.insert(kDownParameter);
    } else if (absl::EndsWith(p, "gate.weight")) {
      c.target_parameters.insert(kRouterParameter);
    } else {
      c.target_parameters.insert(p);
    }
  }
  c.modules_to_save.assign(spec.modules_to_save().begin(), spec.modules_to_save().end());
  return c;
}

absl::Status AddLoraAdapters(const ModelConfig& config, const LoraConfig& lora,
                             ParamStore* params) {
  for (const std::string& m : lora.modules_to_save) {
    if (m == "lm_head" && config.tie_word_embeddings) {
      return absl::InvalidArgumentError(
          "lora.modules_to_save: lm_head is tied to embed_tokens in this model; save embed_tokens");
    }
  }
  if (ExpertsAreParameters(config) && lora.targets("gate")) {
    // PEFT refuses it too: the router is no nn.Linear there.
    return absl::InvalidArgumentError(
        "lora.target_modules: gate names Qwen3-MoE's router; Qwen3.5-MoE's router is a "
        "parameter: name mlp.gate.weight in lora.target_parameters");
  }
  if (!lora.target_parameters.empty()) {
    if (!ExpertsAreParameters(config)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora.target_parameters: ", config.model_type,
          " has no parameter that PEFT adapts that way (Qwen3.5-MoE's routed experts and "
          "router are the ones); ",
          config.has_experts() ? "its experts and router are linear modules: name gate_proj, "
                                 "up_proj, down_proj or gate in lora.target_modules"
                               : "use lora.target_modules"));
    }
    for (const std::string& p : lora.target_parameters) {
      if (p != kGateUpParameter && p != kDownParameter && p != kRouterParameter) {
        return absl::InvalidArgumentError(
            absl::StrCat("lora.target_parameters: ", p,
                         " is no parameter of this model that takes an adapter; it has "
                         "mlp.experts.gate_up_proj, mlp.experts.down_proj and mlp.gate.weight"));
      }
    }
    if (lora.lora_dropout > 0) {
      // PEFT's ParamWrapper cannot apply it and refuses to load such an adapter.
      return absl::InvalidArgumentError(
          "lora.lora_dropout must be 0 with lora.target_parameters, as PEFT requires (its "
          "adapter of a parameter cannot apply dropout, and refuses to load one that says so)");
    }
  }
  if (!lora.target_modules.empty() && ModelTargets(config, lora, /*parameters=*/false).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.target_modules: none of them is a linear module of this model (", config.model_type,
        "); its layers have ",
        config.has_linear_attention() ? "in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, "
                                      : "",
        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj",
        config.moe.shared_expert_intermediate_size > 0 ? ", shared_expert_gate"
        : config.has_experts()                         ? ", gate"
                                                       : ""));
  }
  torch::NoGradGuard no_grad;
  // PEFT's module order: per layer, its token mixer's linears, then the
  // MLP's; a sparse layer's experts one after another, each with its own A.
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (const LayerLinear& m : LayerLinears(config, layer)) {
      if (!Targeted(lora, m)) continue;
      const bool stacked = m.stacked;
      std::vector<int64_t> a_shape = {lora.r, m.in}, b_shape = {m.out, lora.r};
      if (stacked) {
        a_shape.insert(a_shape.begin(), config.moe.num_experts);
        b_shape.insert(b_shape.begin(), config.moe.num_experts);
      }
      at::Tensor a = torch::empty(a_shape, torch::kFloat);
      for (at::Tensor expert : stacked ? a.unbind(0) : std::vector<at::Tensor>{a}) {
        if (lora.init_lora_weights == "gaussian") {
          expert.normal_(0.0, 1.0 / static_cast<double>(lora.r));
        } else {
          torch::nn::init::kaiming_uniform_(expert, std::sqrt(5.0));
        }
      }
      params->Add(m.path + ".lora_A.weight", a, layer, /*trainable=*/true);
      params->Add(m.path + ".lora_B.weight", torch::zeros(b_shape, torch::kFloat), layer,
                  /*trainable=*/true);
    }
  }
  for (const std::string& m : lora.modules_to_save) params->SetTrainable(SaveTargetName(m));
  return absl::OkStatus();
}

absl::StatusOr<LoraConfig> ReadPeftAdapterConfig(const std::string& dir) {
  const fs::path path = fs::path(dir) / "adapter_config.json";
  absl::StatusOr<nlohmann::json> config = ReadAdapterConfig(path);
  if (!config.ok()) return config.status();
  nlohmann::json& j = *config;
  if (!j["r"].is_number_integer() || !j["lora_alpha"].is_number() ||
      !j.contains("target_modules")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path.string(), " is not JSON with r, lora_alpha and target_modules"));
  }
  v1::LoraSpec spec;
  spec.set_r(j["r"].get<int32_t>());
  spec.set_lora_alpha(j["lora_alpha"].get<double>());
  spec.set_use_rslora(j.value("use_rslora", false));
  const nlohmann::json& targets = j["target_modules"];
  if (targets.is_string()) {
    spec.add_target_modules(targets.get<std::string>());
  } else {
    // PEFT may list full module paths; the short name is the last component.
    for (const auto& t : targets) {
      const std::string name = t.get<std::string>();
      spec.add_target_modules(name.substr(name.rfind('.') + 1));
    }
  }
  if (j.contains("target_parameters") && j["target_parameters"].is_array()) {
    for (const auto& p : j["target_parameters"]) {
      if (p.is_string()) spec.add_target_parameters(p.get<std::string>());
    }
  }
  if (j.contains("modules_to_save") && j["modules_to_save"].is_array()) {
    for (const auto& m : j["modules_to_save"]) spec.add_modules_to_save(m.get<std::string>());
  }
  return LoraConfigFromSpec(spec);
}

absl::Status LoadPeftAdapter(const std::string& dir, const ModelConfig& model,
                             const LoraConfig& lora, ParamStore* params) {
  const fs::path config_path = fs::path(dir) / "adapter_config.json";
  absl::StatusOr<nlohmann::json> config = ReadAdapterConfig(config_path);
  if (!config.ok()) return config.status();
  const nlohmann::json& j = *config;
  auto mismatch = [&](const std::string& key, const std::string& theirs, const std::string& ours) {
    return absl::FailedPreconditionError(absl::StrCat(config_path.string(), ": ", key, " is ",
                                                      theirs, " but the job spec says ", ours));
  };
  if (j.value("r", 0) != lora.r)
    return mismatch("r", j.value("r", nlohmann::json()).dump(), absl::StrCat(lora.r));
  if (j.value("lora_alpha", 0.0) != lora.lora_alpha) {
    return mismatch("lora_alpha", j.value("lora_alpha", nlohmann::json()).dump(),
                    absl::StrCat(lora.lora_alpha));
  }
  if (j.value("use_rslora", false) != lora.use_rslora) {
    return mismatch("use_rslora", j.value("use_rslora", nlohmann::json()).dump(),
                    lora.use_rslora ? "true" : "false");
  }
  absl::StatusOr<SafetensorsCheckpoint> ckpt =
      SafetensorsCheckpoint::Open(dir, "adapter_model.safetensors");
  if (!ckpt.ok()) return ckpt.status();
  // Every adapter of the job must be in the file, and the file must hold no
  // adapter the job lacks: either means the target modules differ.
  int64_t matched = 0;
  for (const std::string& name : params->TrainableNames()) {
    const std::vector<int64_t> shape = params->get(name).sizes().vec();
    if (const std::optional<WrappedAdapter> wrapped = WrappedAdapterOf(model, lora, name)) {
      const std::string key = kPeftPrefix + wrapped->key;
      absl::StatusOr<at::Tensor> t = ckpt->tensor(key);
      if (!t.ok()) {
        return absl::FailedPreconditionError(
            absl::StrCat(dir, ": adapter has no tensor ", key, "; target_parameters differ?"));
      }
      if (t->numel() != params->get(name).numel() || t->dim() != 2) {
        return absl::FailedPreconditionError(absl::StrCat(dir, ": tensor ", key,
                                                          " has another shape than r implies (",
                                                          c10::str(t->sizes()), ")"));
      }
      params->Assign(name, WrappedFromFile(*t, shape, wrapped->is_b));
      ++matched;
      continue;
    }
    // A stacked adapter (a sparse layer's experts) is one tensor per expert there.
    absl::StatusOr<at::Tensor> t = ReadParam(*ckpt, model, name, shape, kPeftPrefix, dir);
    if (absl::IsNotFound(t.status())) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.status().message(), "; target_modules differ?"));
    }
    if (!t.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.status().message(), " (another shape than r implies)"));
    }
    params->Assign(name, *t);
    for (const auto& pieces : PiecesOf(model, name).per_expert) matched += pieces.size();
  }
  if (matched != static_cast<int64_t>(ckpt->names().size())) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": adapter holds ", ckpt->names().size(), " tensors, the job trains ",
                     matched, "; target_modules, target_parameters or modules_to_save differ"));
  }
  return absl::OkStatus();
}

absl::Status SavePeftAdapter(const std::string& dir, const std::string& base_model_path,
                             const ModelConfig& model, const LoraConfig& lora,
                             const ParamStore& params) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& name : params.TrainableNames()) {
    const at::Tensor value = params.get(name).detach();
    if (const std::optional<WrappedAdapter> wrapped = WrappedAdapterOf(model, lora, name)) {
      tensors[kPeftPrefix + wrapped->key] = WrappedToFile(value, wrapped->is_b);
      continue;
    }
    for (auto& [stored, piece] : CheckpointTensors(model, name, value)) {
      tensors[kPeftPrefix + stored] = piece;
    }
  }
  if (absl::Status s = WriteSafetensors((fs::path(dir) / "adapter_model.safetensors").string(),
                                        tensors, {{"format", "pt"}});
      !s.ok()) {
    return s;
  }
  const std::vector<std::string> targets = ModelTargets(model, lora, /*parameters=*/false);
  nlohmann::json config = {
      {"alpha_pattern", nlohmann::json::object()},
      {"base_model_name_or_path", base_model_path},
      {"bias", "none"},
      {"exclude_modules", nullptr},
      {"fan_in_fan_out", false},
      {"inference_mode", true},
      {"init_lora_weights",
       lora.init_lora_weights == "gaussian" ? nlohmann::json("gaussian") : nlohmann::json(true)},
      {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr},
      {"lora_alpha", lora.lora_alpha},
      {"lora_bias", false},
      {"lora_dropout", lora.lora_dropout},
      {"modules_to_save", lora.modules_to_save.empty() ? nlohmann::json(nullptr)
                                                       : nlohmann::json(lora.modules_to_save)},
      {"peft_type", "LORA"},
      {"r", lora.r},
      {"rank_pattern", nlohmann::json::object()},
      {"revision", nullptr},
      {"target_modules", targets},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", lora.use_rslora},
  };
  // Only when there are some: an adapter without them stays as PEFT writes one.
  if (const std::vector<std::string> parameters = ModelTargets(model, lora, /*parameters=*/true);
      !parameters.empty()) {
    config["target_parameters"] = parameters;
  }
  std::ofstream out(fs::path(dir) / "adapter_config.json", std::ios::trunc);
  out << config.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir, "/adapter_config.json"));
  return absl::OkStatus();
}

std::vector<std::pair<std::string, at::Tensor>> MergedTensors(const LoraConfig& lora,
                                                              const ParamStore& params) {
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> out;
  const std::string a_suffix = ".lora_A.weight";
  // W + scaling * B @ A of `module` (batched over the experts when stacked),
  // or W when it has no adapter.
  auto merged = [&](const at::Tensor& w, const std::string& module) {
    if (!params.contains(module + a_suffix)) return w;
    return w + lora.scaling() *
                   at::matmul(params.get(module + ".lora_B.weight"), params.get(module + a_suffix));
  };
  for (const std::string& name : params.names()) {
    if (name.find(".lora_") != std::string::npos) continue;
    at::Tensor value = params.get(name).detach();
    if (absl::EndsWith(name, ".experts.gate_up_proj") && params.contains(name + a_suffix)) {
      value = merged(value, name);  // Qwen3.5-MoE's: one adapter over gate and up
    } else if (absl::EndsWith(name, ".experts.gate_up_proj")) {
      // Stacked experts: gate rows, then up rows (expert_layout.h).
      const std::string experts = name.substr(0, name.size() - std::string("gate_up_proj").size());
      const std::vector<at::Tensor> halves = value.chunk(2, 1);
      value = at::cat(
          {merged(halves[0], experts + "gate_proj"), merged(halves[1], experts + "up_proj")}, 1);
    } else if (absl::EndsWith(name, ".experts.down_proj")) {
      value = merged(value, name);
    } else if (absl::EndsWith(name, ".weight")) {
      value = merged(value, name.substr(0, name.size() - std::string(".weight").size()));
    }
    out.emplace_back(name, value);
  }
  return out;
}

}  // namespace ballast::train
