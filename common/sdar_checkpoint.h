// SDAR checkpoints: block-diffusion models (JetLM's SDAR) whose decoder is
// Qwen3's, weight for weight, and whose config.json says model_type "sdar"
// and carries a few keys of its own; or, for SDAR's mixture of experts
// (SDAR-30B-A3B), Qwen3-MoE's under model_type "sdar_moe". That layout was
// read from SDAR's own engine (JetEngine, jetengine/models/sdar_moe.py and
// jetengine/utils/loader.py at github.com/Labman42/JetEngine 11563d1, which
// JetAstra/SDAR's README points to): the router mlp.gate and per-expert
// mlp.experts.{e}.{gate,up,down}_proj weights as Qwen3-MoE's, a layer sparse
// when (i + 1) % decoder_sparse_step == 0, the top-k weights always
// renormalised (so norm_topk_prob must be true) and no mlp_only_layers. Ballast trains them with
// task: block_diffusion, and every key their config.json holds is either one
// the Qwen3 decoder reads, one whose effect Ballast reproduces, or refused
// by name: none is silently ignored. Thread-safe (no state).
//
// The SDAR keys and what becomes of each:
//   block_size            used: the default of block_diffusion.block_length,
//                         which must equal it when both are given (the
//                         checkpoint was trained with that block length).
//   mask_token_id         used: the default of block_diffusion.mask_token_id,
//                         which must equal it when both are given.
//   fuse_cross_entropy    accepted: it picks a fused cross-entropy kernel in
//                         SDAR's training code; Ballast's loss is always the
//                         fused one, with the same value either way.
//   enable_block_generation
//                         accepted: a switch of SDAR's block-wise sampler,
//                         which inference reads and training does not.
//   auto_map              accepted: it names SDAR's Python code, which Ballast
//                         does not run (the decoder is its own).
//   use_regular_causal    refused when true: it makes attention outside the
//                         noised block token-causal, which is not the
//                         block-diffusion mask that Ballast trains.
//   architectures         must name SDARForCausalLM (or Qwen3ForCausalLM);
//                         for sdar_moe SDARMoeForCausalLM (or
//                         Qwen3MoeForCausalLM).
// sdar_moe also takes Qwen3-MoE's keys (common/model_config.h's MoeConfig).
// Any other key that is not one of Qwen3's is refused, naming it.
#ifndef BALLAST_COMMON_SDAR_CHECKPOINT_H_
#define BALLAST_COMMON_SDAR_CHECKPOINT_H_

#include <nlohmann/json_fwd.hpp>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "ballast/v1/job_spec.pb.h"

namespace ballast {

inline constexpr absl::string_view kSdarModelType = "sdar";
inline constexpr absl::string_view kSdarMoeModelType = "sdar_moe";

// True for an SDAR model_type: sdar or sdar_moe.
bool IsSdarModelType(absl::string_view model_type);

// Fills the spec's block-diffusion keys that it leaves unset from an SDAR
// `config` (block_size, mask_token_id). Does nothing for other model types
// or tasks, or where the config's values are not integers (CheckSdarConfig
// reports those).
void ApplySdarDefaults(const nlohmann::json& config, v1::JobSpec* spec);

// OK when `config`, an SDAR config.json (`config_name` is its path, for the
// messages), may train under `spec`: the task is block_diffusion, the spec
// agrees with block_size and mask_token_id, and every key is known and
// allowed (see above). Otherwise INVALID_ARGUMENT naming the key.
absl::Status CheckSdarConfig(const nlohmann::json& config, const v1::JobSpec& spec,
                             absl::string_view config_name);

}  // namespace ballast

#endif  // BALLAST_COMMON_SDAR_CHECKPOINT_H_
