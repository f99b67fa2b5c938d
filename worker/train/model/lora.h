// LoRA as PEFT defines it (huggingface/peft, tuners/lora):
//   y = base(x) + B(A(dropout(x))) * scaling,  A: (r, in), B: (out, r),
//   scaling = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora.
// Adapters live in the ParamStore under "<module>.lora_A.weight" and
// "<module>.lora_B.weight", next to the frozen base weight.
#ifndef BALLAST_WORKER_TRAIN_MODEL_LORA_H_
#define BALLAST_WORKER_TRAIN_MODEL_LORA_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "common/model_config.h"
#include "common/spec_rules.h"
#include "worker/train/model/param_store.h"

namespace ballast::train {

// The spec's lora section; its defaults are the spec's (common/spec_rules.h).
struct LoraConfig {
  int64_t r = SpecDefaultNumber("lora.r");
  double lora_alpha = SpecDefaultNumber("lora.lora_alpha");
  bool use_rslora = SpecDefaultNumber("lora.use_rslora") != 0;
  double lora_dropout = SpecDefaultNumber("lora.lora_dropout");
  // Module short names (q_proj, ..., down_proj, Gated DeltaNet's in_proj_qkv,
  // in_proj_z, in_proj_b, in_proj_a, out_proj); "all-linear" is expanded to
  // every one of them, and each layer adapts those it has.
  std::set<std::string> target_modules;
  // kaiming or gaussian.
  std::string init_lora_weights = std::string(SpecDefaultText("lora.init_lora_weights"));
  // embed_tokens or lm_head.
  std::vector<std::string> modules_to_save;
  // Target modules exactly as the user wrote them, for adapter_config.json.
  std::vector<std::string> target_modules_as_given;
  // Qwen3.5-MoE's parameters that PEFT adapts by target_parameters, by the
  // name under its layer's "mlp." (experts.gate_up_proj, experts.down_proj,
  // gate.weight), whatever suffix of it the spec wrote.
  std::set<std::string> target_parameters;

  double scaling() const;
  bool targets(const std::string& module_short_name) const {
    return target_modules.count(module_short_name) != 0;
  }
  bool targets_parameter(const std::string& mlp_parameter) const {
    return target_parameters.count(mlp_parameter) != 0;
  }
};

// From the job spec's lora section (already validated).
LoraConfig LoraConfigFromSpec(const v1::LoraSpec& spec);

// Adds lora_A / lora_B for every targeted linear of every layer to `params`
// (a layer adapts the targets its token mixer and MLP have; INVALID_ARGUMENT
// when no layer has any of them),
// initialised as PEFT does: A kaiming_uniform(a=sqrt(5)) or normal(0, 1/r),
// B zeros. Makes modules_to_save trainable. Draws from the default CPU
// generator, which the caller seeds.
absl::Status AddLoraAdapters(const ModelConfig& config, const LoraConfig& lora, ParamStore* params);

// Reads a PEFT adapter folder's adapter_config.json (r, lora_alpha,
// use_rslora, target_modules as short names or full paths, target_parameters,
// modules_to_save).
absl::StatusOr<LoraConfig> ReadPeftAdapterConfig(const std::string& dir);

// Copies an existing PEFT adapter folder's tensors into the adapters made by
// AddLoraAdapters. Its adapter_config.json must agree with `lora` on r,
// lora_alpha, use_rslora and target modules (FAILED_PRECONDITION otherwise).
// Keys are PEFT's for `model`'s checkpoint layout (tensor_names.h), e.g.
// base_model.model.model.language_model.layers.0.linear_attn.in_proj_qkv.lora_A.weight
// for Qwen3.5's vision-language checkpoint.
absl::Status LoadPeftAdapter(const std::string& dir, const ModelConfig& model,
                             const LoraConfig& lora, ParamStore* params);

// Writes dir/adapter_model.safetensors and dir/adapter_config.json exactly as
// PEFT's save_pretrained does, so PeftModel.from_pretrained(base, dir) loads it;
// target_modules lists the targets that `model` has.
absl::Status SavePeftAdapter(const std::string& dir, const std::string& base_model_path,
                             const ModelConfig& model, const LoraConfig& lora,
                             const ParamStore& params);

// The base tensor name with the adapter folded in: W + scaling * B @ A.
// Returns every base tensor (merged where adapted), for a full HF export.
std::vector<std::pair<std::string, at::Tensor>> MergedTensors(const LoraConfig& lora,
                                                              const ParamStore& params);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_LORA_H_
