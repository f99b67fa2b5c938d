#include "worker/train/model/decoder.h"

#include <torch/torch.h>

#include <cmath>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/lora_update.h"
#include "kernels/rms_norm.h"
#include "kernels/swiglu.h"
#include "worker/train/model/activation_checkpoint.h"
#include "worker/train/model/attention_mixer.h"
#include "worker/train/model/gated_delta_net.h"
#include "worker/train/model/sparse_moe.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

// HF's rotary inverse frequencies, computed with the same ops and dtypes as
// transformers' _compute_default_rope_parameters / _compute_llama3_parameters
// so that cos/sin match bit for bit in fp32.
at::Tensor RopeInvFreq(const ModelConfig& c) {
  const int64_t d = c.rotary_dim;  // HF: int(head_dim * partial_rotary_factor)
  at::Tensor exponent = torch::arange(0, d, 2, torch::kLong).to(torch::kFloat) / d;
  at::Tensor inv_freq = 1.0 / torch::pow(c.rope_theta, exponent);
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    inv_freq = inv_freq / s.factor;
  } else if (s.type == "llama3") {
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
    at::Tensor smooth =
        (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_freq_wavelen).logical_and(wavelen <= low_freq_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return inv_freq;
}

// Tensors stacked along dim 0. Without a copy when there is only one, or
// when they are adjacent views of one buffer (a sharded model lays a layer's
// q/k/v and gate/up out that way): the copy would be what autograd keeps for
// backward, a second resident copy of the weights.
at::Tensor JoinRows(const std::vector<at::Tensor>& parts) {
  if (parts.size() == 1) return parts.front();
  const at::Tensor& first = parts.front();
  bool adjacent = first.is_view() && first.is_contiguous() && first._base().dim() == 1 &&
                  first._base().is_contiguous();
  int64_t rows = first.size(0);
  for (size_t i = 1; adjacent && i < parts.size(); ++i) {
    const at::Tensor& p = parts[i];
    const at::Tensor& before = parts[i - 1];
    adjacent = p.is_view() && p.is_contiguous() && p._base().is_same(first._base()) &&
               p.sizes().slice(1) == first.sizes().slice(1) &&
               p.storage_offset() == before.storage_offset() + before.numel();
    rows += p.size(0);
  }
  if (!adjacent) return at::cat(parts, 0);
  const at::Tensor base(first._base());  // 1-D
  std::vector<int64_t> shape = first.sizes().vec();
  shape[0] = rows;
  const int64_t numel = rows * (first.numel() / first.size(0));
  return base.narrow(0, first.storage_offset() - base.storage_offset(), numel).view(shape);
}

}  // namespace

Decoder::Decoder(ModelConfig config, const ParamStore* params, std::optional<LoraConfig> lora,
                 at::ScalarType compute_dtype, bool gradient_checkpointing)
    : config_(std::move(config)),
      params_(params),
      lora_(std::move(lora)),
      compute_dtype_(compute_dtype),
      gradient_checkpointing_(gradient_checkpointing),
      inv_freq_(RopeInvFreq(config_).to(params->device())) {}

at::Tensor Decoder::Weight(const std::string& name) const { return Weight(name, compute_dtype_); }

at::Tensor Decoder::Weight(const std::string& name, at::ScalarType dtype) const {
  const at::Tensor& w = params_->get(name);
  // Differentiable cast: in bf16 compute the gradient flows back to the fp32 master.
  return w.scalar_type() == dtype ? w : w.to(dtype);
}

const at::Tensor& Decoder::lm_head_weight() const {
  return params_->get(config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
}

at::Tensor Decoder::Project(const std::string& prefix, const std::vector<std::string>& modules,
                            const at::Tensor& x, bool training) const {
  std::vector<at::Tensor> weights;
  std::vector<int64_t> out_sizes;
  bool any_bias = false;
  for (const std::string& m : modules) {
    weights.push_back(Weight(prefix + m + ".weight"));  // (out_m, in)
    out_sizes.push_back(weights.back().size(0));
    any_bias |= params_->contains(prefix + m + ".bias");
  }
  at::Tensor bias;  // (sum out), zeros for a module without one (Qwen2 has q/k/v bias only)
  if (any_bias) {
    std::vector<at::Tensor> biases;
    for (size_t i = 0; i < modules.size(); ++i) {
      const std::string name = prefix + modules[i] + ".bias";
      biases.push_back(params_->contains(name) ? Weight(name)
                                               : at::zeros({out_sizes[i]}, weights[i].options()));
    }
    bias = JoinRows(biases);
  }
  at::Tensor y = at::linear(x, JoinRows(weights), bias);

  std::vector<size_t> adapted;  // indices into modules
  for (size_t i = 0; i < modules.size(); ++i) {
    if (lora_ && lora_->targets(modules[i])) adapted.push_back(i);
  }
  if (adapted.empty()) return y;

  // down = dropout(x) A^T of every adapted module, side by side: (T, sum r).
  // Without dropout the modules share x, so their A's are one GEMM; with it
  // each module draws its own mask, in module order, as PEFT does.
  std::vector<at::Tensor> a_weights, downs;
  for (size_t i : adapted) {
    at::Tensor a = Weight(prefix + modules[i] + ".lora_A.weight");  // (r, in)
    if (lora_->lora_dropout > 0) {
      downs.push_back(at::linear(at::dropout(x, lora_->lora_dropout, training), a));
    }
    a_weights.push_back(std::move(a));
  }
  at::Tensor down =
      lora_->lora_dropout > 0 ? at::cat(downs, 1) : at::linear(x, JoinRows(a_weights));
  // y[:, module's columns] += scaling * down[:, module's ranks] @ B^T, per
  // adapted module (see lora_update.h).
  std::vector<at::Tensor> ups;
  std::vector<int64_t> out_begins;
  int64_t column = 0;
  for (size_t i = 0, next = 0; i < modules.size(); column += out_sizes[i], ++i) {
    if (next < adapted.size() && adapted[next] == i) {
      ups.push_back(Weight(prefix + modules[i] + ".lora_B.weight"));  // (out, r)
      out_begins.push_back(column);
      ++next;
    }
  }
  return kernels::add_lora_update(y, down, ups, out_begins, lora_->scaling());
}

at::Tensor Decoder::Norm(const at::Tensor& x, const std::string& weight_name) const {
  return config_.zero_centred_norm
             ? kernels::rms_norm_zero_centred(x, Weight(weight_name), config_.rms_norm_eps)
             : kernels::rms_norm(x, Weight(weight_name), config_.rms_norm_eps);
}

at::Tensor Decoder::LayerForward(int64_t layer, const at::Tensor& h, const at::Tensor& cos,
                                 const at::Tensor& sin, const kernels::AttentionMask& mask,
                                 bool training) const {
  const std::string p = LayerPrefix(layer);

  // Token mixer.
  at::Tensor x = Norm(h, p + "input_layernorm.weight");
  at::Tensor out =
      h + (config_.layer_types[layer] == TokenMixer::kGatedDeltaNet
               ? GatedDeltaNet(*this, p + "linear_attn.", x, mask, training)
               : SoftmaxAttention(*this, p + "self_attn.", x, cos, sin, mask, training));

  // MLP block; gate and up read the same x, so they are one projection, and
  // the gate reads it whole.
  x = Norm(out, p + "post_attention_layernorm.weight");
  if (config_.moe.sparse(layer)) return out + SparseMoe(*this, layer, x, training);
  at::Tensor gate_up = Project(p + "mlp.", {"gate_proj", "up_proj"}, x, training);
  return out + Project(p + "mlp.", {"down_proj"}, kernels::swiglu(gate_up), training);
}

Decoder::LayerInputs Decoder::InputsOf(const PackedBatch& batch) const {
  // cos/sin (T, rotary_dim) in fp32 as HF computes them, then in the compute dtype.
  at::Tensor freqs = batch.position_ids.to(torch::kFloat).unsqueeze(1) * inv_freq_.unsqueeze(0);
  at::Tensor emb = torch::cat({freqs, freqs}, -1);
  LayerInputs in;
  in.cos = emb.cos().to(compute_dtype_);
  in.sin = emb.sin().to(compute_dtype_);
  in.mask.kind = batch.mask.kind;
  in.mask.block_size = batch.mask.block_size;
  in.mask.cu_seqlens = batch.cu_seqlens;
  return in;
}

at::Tensor Decoder::Embed(const PackedBatch& batch) const {
  return at::embedding(Weight("model.embed_tokens.weight"), batch.input_ids);  // (T, H)
}

at::Tensor Decoder::HiddenStates(const PackedBatch& batch, bool training) const {
  const LayerInputs in = InputsOf(batch);
  at::Tensor h = Embed(batch);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    if (layer_runner_ != nullptr) {
      h = layer_runner_->RunLayer(*this, i, h, in.cos, in.sin, in.mask, training);
    } else if (gradient_checkpointing_ && training && torch::GradMode::is_enabled()) {
      h = CheckpointedLayer(*this, *params_, i, h, in.cos, in.sin, in.mask);
    } else {
      h = LayerForward(i, h, in.cos, in.sin, in.mask, training);
    }
  }
  return Norm(h, "model.norm.weight");
}

void Decoder::Route(const std::vector<const PackedBatch*>& batches,
                    const std::vector<std::shared_ptr<RoutingStats>>& routing, int64_t last,
                    bool training) {
  TORCH_CHECK(batches.size() == routing.size(), "Decoder::Route: ", batches.size(), " batches for ",
              routing.size(), " routing records");
  TORCH_CHECK(last >= 0 && last < config_.num_hidden_layers, "Decoder::Route: layer ", last, " of ",
              config_.num_hidden_layers);
  torch::NoGradGuard no_grad;
  std::vector<LayerInputs> inputs;
  std::vector<at::Tensor> hidden;
  for (const PackedBatch* batch : batches) {
    inputs.push_back(InputsOf(*batch));
    hidden.push_back(Embed(*batch));
  }
  // Each forward records where its own routing goes; the decoder's is back after.
  absl::Cleanup restore = [this, own = routing_] { routing_ = own; };
  for (int64_t layer = 0; layer <= last; ++layer) {
    const auto forwards = [&] {
      for (size_t b = 0; b < batches.size(); ++b) {
        routing_ = routing[b];
        const LayerInputs& in = inputs[b];
        hidden[b] = LayerForward(layer, hidden[b], in.cos, in.sin, in.mask, training);
      }
    };
    if (layer_runner_ != nullptr) {
      layer_runner_->WithLayer(layer, last, forwards);
    } else {
      forwards();
    }
  }
}

at::Tensor Decoder::Logits(const PackedBatch& batch) const {
  torch::NoGradGuard no_grad;
  at::Tensor hidden = HiddenStates(batch, /*training=*/false);
  return at::linear(hidden.to(torch::kFloat), lm_head_weight().to(torch::kFloat));
}

}  // namespace ballast::train
