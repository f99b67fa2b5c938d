#include "worker/train/checkpoint/export.h"

#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace fs = std::filesystem;

absl::Status ExportHfModel(const std::string& base_dir, const std::string& out_dir,
                           const ModelConfig& config,
                           const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", out_dir, ": ", ec.message()));
  std::map<std::string, at::Tensor> by_name;
  for (const auto& [name, t] : tensors) {
    for (auto& [stored, piece] : CheckpointTensors(config, name, t.detach())) {
      by_name[stored] = piece;
    }
  }
  const std::vector<std::string> kept = TensorsOutsideDecoder(base_dir, config);
  if (!kept.empty()) {
    absl::StatusOr<SafetensorsCheckpoint> base = SafetensorsCheckpoint::Open(base_dir);
    if (!base.ok()) return base.status();
    for (const std::string& name : kept) {
      absl::StatusOr<at::Tensor> t = base->tensor(name);  // a view of the file's bytes
      if (!t.ok()) return t.status();
      by_name.try_emplace(name, *t);
    }
  }
  if (absl::Status s = WriteSafetensors((fs::path(out_dir) / "model.safetensors").string(), by_name,
                                        {{"format", "pt"}});
      !s.ok()) {
    return s;
  }
  for (const char* file : {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json"}) {
    const fs::path src = fs::path(base_dir) / file;
    if (!fs::exists(src)) continue;
    fs::copy_file(src, fs::path(out_dir) / file, fs::copy_options::overwrite_existing, ec);
    if (ec)
      return absl::InternalError(absl::StrCat("cannot copy ", src.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SaveRoutingBiasBesideAdapter(
    const std::string& adapter_dir, const std::map<std::string, at::Tensor>& biases) {
  const std::string path = (fs::path(adapter_dir) / kRoutingBiasFile).string();
  if (absl::Status s = WriteSafetensors(path, biases); !s.ok()) return s;
  return path;
}

absl::Status ExportMergedLora(const std::string& base_dir, const std::string& adapter_dir,
                              const std::string& out_dir) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(base_dir);
  if (!config.ok()) return config.status();
  absl::StatusOr<LoraConfig> lora = ReadPeftAdapterConfig(adapter_dir);
  if (!lora.ok()) return lora.status();
  absl::StatusOr<ParamStore> params = LoadPretrained(base_dir, *config, /*trainable=*/false);
  if (!params.ok()) return params.status();
  if (absl::Status s = AddLoraAdapters(*config, *lora, &*params); !s.ok()) return s;
  if (absl::Status s = LoadPeftAdapter(adapter_dir, *config, *lora, &*params); !s.ok()) return s;
  std::vector<std::pair<std::string, at::Tensor>> merged = MergedTensors(*lora, *params);
  const fs::path bias_file = fs::path(adapter_dir) / kRoutingBiasFile;
  if (std::error_code ec; fs::exists(bias_file, ec)) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(bias_file.string());
    if (!file.ok()) return file.status();
    for (const std::string& name : (*file)->names()) {
      absl::StatusOr<at::Tensor> t = (*file)->tensor(name);
      if (!t.ok()) return t.status();
      merged.emplace_back(name, *t);
    }
  }
  return ExportHfModel(base_dir, out_dir, *config, merged);
}

}  // namespace ballast::train
