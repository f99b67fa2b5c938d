// The model families Ballast trains: the values of an HF config.json's
// model_type that the trainer's decoder implements. This is the one list;
// submission (ValidateJobSpecFiles), ballast-train and the trainer's
// config.json parser all check against it. Thread-safe (constants only).
#ifndef BALLAST_COMMON_MODEL_TYPES_H_
#define BALLAST_COMMON_MODEL_TYPES_H_

#include <array>
#include <string>

#include "absl/strings/string_view.h"

namespace ballast {

// Every supported model_type, in the order error messages list them.
// sdar is Qwen3's decoder under block-diffusion training (common/sdar_checkpoint.h).
// qwen3_5 is Qwen3.5's released vision-language checkpoint, of which the
// trainer reads and trains the text decoder; qwen3_5_text is that decoder
// alone (transformers' Qwen3_5ForCausalLM). qwen3_moe is Qwen3's decoder with
// mixture-of-experts MLPs (transformers' Qwen3MoeForCausalLM), and sdar_moe
// is that decoder under block-diffusion training (SDAR-30B-A3B). qwen3_5_moe
// and qwen3_5_moe_text are Qwen3.5's hybrid decoder with mixture-of-experts
// MLPs and a gated shared expert, in the same two layouts as qwen3_5 and
// qwen3_5_text.
inline constexpr std::array<absl::string_view, 10> kSupportedModelTypes = {
    "llama",        "qwen2",     "qwen3",    "sdar",        "qwen3_5",
    "qwen3_5_text", "qwen3_moe", "sdar_moe", "qwen3_5_moe", "qwen3_5_moe_text"};

// True when `model_type` is one of kSupportedModelTypes (exact, case-sensitive).
bool IsSupportedModelType(absl::string_view model_type);

// kSupportedModelTypes as "llama, qwen2, qwen3, sdar, ...", for error messages.
std::string SupportedModelTypesText();

// Where a config.json of `model_type` keeps the decoder's keys: "text_config"
// for a vision-language wrapper (qwen3_5, qwen3_5_moe), "" for the root object.
absl::string_view TextConfigKey(absl::string_view model_type);

}  // namespace ballast

#endif  // BALLAST_COMMON_MODEL_TYPES_H_
