// RoutingBias: the per-expert bias of DeepSeek-V3's auxiliary-loss-free load
// balancing (arXiv 2412.19437, section 2.1.2; moe.balance aux_free), one (E)
// fp32 tensor per sparse layer. With p the router's softmax (sparse_moe.h):
//
//   selection   idx = topk(p + b, k)                 the bias steers the choice
//   weights     w   = p[idx], / Σ w if norm_topk_prob the bias never weights
//   update      b_e += γ · sign(mean_e' load_e' − load_e)   after each applied step
//
// load_e counts the (token, choice) pairs routed to expert e over every
// counted token of the step (all micro-batches and ranks): StepRouting's
// reduced counts, the same that global balancing's f and the load metrics
// read, so padding and block diffusion's clean half are left out as there.
// Every rank adds the same update computed from the same reduced numbers,
// so the biases stay identical across ranks without a collective of their
// own (they decide the routing, so they must). A skipped or rolled-back step
// updates nothing; a rollback puts the bias back with the weights
// (recovery.h).
//
// Not a parameter: no gradient, no optimizer state, no LoRA adapter. It
// lives beside the model's tensors rather than among them because a sharded
// model (ZeRO-3) splits and casts those, while the bias must be whole and
// fp32 on every rank: a step of γ = 0.001 would vanish in bf16 against a
// bias of order 1. Its tensors are named as HF's DeepSeek-V3 names its own,
// model.layers.{i}.mlp.gate.e_score_correction_bias, in checkpoints and in
// an exported model.
//
// Thread-compatible.
#ifndef BALLAST_WORKER_TRAIN_MODEL_ROUTING_BIAS_H_
#define BALLAST_WORKER_TRAIN_MODEL_ROUTING_BIAS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "worker/train/model/step_routing.h"

namespace ballast::train {

class RoutingBias {
 public:
  // Zero biases for the decoder layers `sparse_layers`, each of `num_experts`,
  // on `device`; `rate` is γ (moe.aux_free_rate).
  RoutingBias(std::vector<int64_t> sparse_layers, int64_t num_experts, double rate,
              c10::Device device);

  // The name of decoder layer `layer`'s bias.
  static std::string TensorName(int64_t layer);

  // Decoder layer `layer`'s bias, (E) fp32 on the device; undefined for a
  // dense layer.
  const at::Tensor& of(int64_t layer) const;

  // One step's update from its routing, reduced over micro-batches and
  // ranks (`step.sparse_layers()` must be this bias's layers).
  void Update(const StepRouting& step);

  // The biases by name, copies on the host (checkpoints, snapshots, the
  // export).
  std::map<std::string, at::Tensor> Tensors() const;
  // Puts saved biases back. DATA_LOSS names a missing tensor or one of
  // another shape.
  absl::Status Restore(const std::map<std::string, at::Tensor>& tensors);

  // Starts from the biases the model folder `model_dir` (of `config`)
  // holds, when it holds them: a full export of an aux_free job, whose
  // training goes on from where that one left the routing. Returns whether
  // it did. DATA_LOSS when the folder holds some but not all of them, or one
  // of another shape.
  absl::StatusOr<bool> StartFrom(const std::string& model_dir, const ModelConfig& config);

 private:
  std::vector<int64_t> sparse_layers_;
  double rate_;
  std::vector<at::Tensor> bias_;  // indexed by decoder layer; undefined when dense
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_MODEL_ROUTING_BIAS_H_
