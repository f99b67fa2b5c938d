#include "worker/train/model/inference.h"

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/load_balancing.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/pretrained.h"

namespace ballast::train {

absl::StatusOr<InferenceModel> LoadInferenceModel(const std::string& model_dir,
                                                  const std::string& adapter_dir) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  absl::StatusOr<ParamStore> params = LoadPretrained(model_dir, *config, /*trainable=*/false);
  if (!params.ok()) return params.status();
  std::optional<LoraConfig> lora;
  if (!adapter_dir.empty()) {
    absl::StatusOr<LoraConfig> read = ReadPeftAdapterConfig(adapter_dir);
    if (!read.ok()) return read.status();
    lora = *read;
    if (absl::Status s = AddLoraAdapters(*config, *lora, &*params); !s.ok()) return s;
    if (absl::Status s = LoadPeftAdapter(adapter_dir, *config, *lora, &*params); !s.ok()) return s;
  }
  return InferenceModel{*std::move(config), *std::move(params), std::move(lora)};
}

absl::Status WriteLogits(const std::string& model_dir, const std::string& adapter_dir,
                         const std::string& tokens_path, const std::string& out_path,
                         bool gradients) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  absl::StatusOr<TokenizedDataset> docs =
      TokenizedDataset::Load(tokens_path, config->vocab_size, config->max_position_embeddings);
  if (!docs.ok()) return docs.status();
  absl::StatusOr<InferenceModel> model = LoadInferenceModel(model_dir, adapter_dir);
  if (!model.ok()) return model.status();
  Decoder decoder(model->config, &model->params, model->lora, torch::kFloat,
                  /*gradient_checkpointing=*/false);
  PackedBatch batch = docs->Pack(0, docs->rows_per_epoch());
  const MoeConfig& moe = model->config.moe;
  // A forward's routing: the packed documents are one forward.
  auto routing = [&](double weight, bool keep_logits) {
    return model->config.has_experts()
               ? std::make_shared<RoutingStats>(model->config.num_hidden_layers, moe.num_experts,
                                                moe.top_k, weight, keep_logits)
               : nullptr;
  };
  decoder.set_routing(routing(0, /*keep_logits=*/true));
  std::map<std::string, at::Tensor> out = {{"logits", decoder.Logits(batch)},
                                           {"cu_seqlens", batch.cu_seqlens}};
  if (const std::shared_ptr<RoutingStats>& stats = decoder.routing()) {
    out["aux_loss"] = stats->AuxLoss().reshape({1});
    for (size_t layer = 0; layer < stats->router_logits().size(); ++layer) {
      const at::Tensor& logits = stats->router_logits()[layer];
      if (logits.defined()) out[absl::StrCat("router_logits.", layer)] = logits;
    }
  }
  if (gradients) {
    decoder.set_routing(routing(moe.router_aux_loss_coef, /*keep_logits=*/false));
    ParamStore& params = model->params;
    if (!model->lora) {
      for (const std::string& name : params.names()) params.SetTrainable(name);
    }
    const at::Tensor logits = at::linear(decoder.HiddenStates(batch, /*training=*/false),
                                         decoder.lm_head_weight());  // (T, V) fp32
    at::cross_entropy_loss(logits, batch.targets, {}, at::Reduction::Sum, kIgnoreLabel).backward();
    for (const std::string& name : params.TrainableNames()) {
      const at::Tensor& grad = params.get(name).grad();
      for (auto& [stored, piece] : CheckpointTensors(
               model->config, name, grad.defined() ? grad : at::zeros_like(params.get(name)))) {
        out["grad." + stored] = piece;
      }
    }
  }
  return WriteSafetensors(out_path, out);
}

}  // namespace ballast::train
