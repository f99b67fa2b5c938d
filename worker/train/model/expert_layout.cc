#include "worker/train/model/expert_layout.h"

#include <torch/torch.h>

#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

constexpr char kExperts[] = ".mlp.experts.";
constexpr size_t kExpertsLength = sizeof(kExperts) - 1;

// For a stacked name, the layer's experts prefix ("model.layers.3.mlp.experts.")
// and what follows it ("gate_up_proj", "down_proj.lora_A.weight"); nullopt
// for any other name (a per-expert name has a digit there).
std::optional<std::pair<std::string, std::string>> SplitStacked(const std::string& name) {
  const size_t at = name.find(kExperts);
  if (!absl::StartsWith(name, "model.layers.") || at == std::string::npos) return std::nullopt;
  const size_t rest = at + kExpertsLength;
  if (rest >= name.size() || absl::ascii_isdigit(name[rest])) return std::nullopt;
  return std::make_pair(name.substr(0, rest), name.substr(rest));
}

std::string ShapeText(at::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

}  // namespace

std::string ExpertsPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, kExperts); }

CheckpointPieces PiecesOf(const ModelConfig& config, const std::string& name) {
  CheckpointPieces out;
  const auto split = SplitStacked(name);
  if (!split) {
    out.per_expert.push_back({CheckpointName(config, name)});
    return out;
  }
  const auto& [prefix, rest] = *split;
  out.stacked = true;
  for (int64_t e = 0; e < config.moe.num_experts; ++e) {
    const std::string expert = absl::StrCat(prefix, e, ".");
    std::vector<std::string> pieces;
    if (rest == "gate_up_proj") {
      pieces = {expert + "gate_proj.weight", expert + "up_proj.weight"};
    } else if (rest == "down_proj") {
      pieces = {expert + "down_proj.weight"};
    } else {
      pieces = {expert + rest};  // an adapter: "gate_proj.lora_A.weight"
    }
    for (std::string& p : pieces) p = CheckpointName(config, p);
    out.per_expert.push_back(std::move(pieces));
  }
  return out;
}

absl::StatusOr<std::vector<at::Tensor>> ReadParamPieces(
    const SafetensorsCheckpoint& checkpoint, const ModelConfig& config, const std::string& name,
    const std::vector<int64_t>& shape, const std::string& key_prefix, const std::string& where) {
  const CheckpointPieces pieces = PiecesOf(config, name);
  // A checkpoint in transformers 5's fused layout holds the stacked tensor
  // itself, under the same name.
  if (const std::string fused = key_prefix + CheckpointName(config, name);
      pieces.stacked && checkpoint.contains(fused)) {
    absl::StatusOr<at::Tensor> t = checkpoint.tensor(fused);
    if (!t.ok()) return t.status();
    if (t->sizes() != at::IntArrayRef(shape)) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ": tensor ", fused, " has shape ", ShapeText(t->sizes()),
                       ", config.json implies ", ShapeText(shape)));
    }
    return std::vector<at::Tensor>{*t};
  }
  // Each piece's shape: the whole, or one expert's slice split in its pieces' rows.
  std::vector<int64_t> piece_shape = shape;
  if (pieces.stacked) {
    piece_shape.erase(piece_shape.begin());
    piece_shape[0] /= static_cast<int64_t>(pieces.per_expert.front().size());
  }
  std::vector<at::Tensor> out;
  for (const std::vector<std::string>& names : pieces.per_expert) {
    for (const std::string& piece : names) {
      const std::string key = key_prefix + piece;
      absl::StatusOr<at::Tensor> t = checkpoint.tensor(key);
      if (!t.ok())
        return absl::NotFoundError(absl::StrCat(where, ": checkpoint has no tensor ", key));
      if (t->sizes() != at::IntArrayRef(piece_shape)) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ": tensor ", key, " has shape ", ShapeText(t->sizes()),
                         ", config.json implies ", ShapeText(piece_shape)));
      }
      out.push_back(*t);
    }
  }
  return out;
}

absl::StatusOr<at::Tensor> ReadParam(const SafetensorsCheckpoint& checkpoint,
                                     const ModelConfig& config, const std::string& name,
                                     const std::vector<int64_t>& shape,
                                     const std::string& key_prefix, const std::string& where) {
  absl::StatusOr<std::vector<at::Tensor>> pieces =
      ReadParamPieces(checkpoint, config, name, shape, key_prefix, where);
  if (!pieces.ok()) return pieces.status();
  if (!PiecesOf(config, name).stacked) return pieces->front();
  // One fp32 copy (the mapped pieces are read-only), the pieces' elements in order.
  at::Tensor stacked = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
  at::Tensor flat = stacked.view({-1});
  int64_t offset = 0;
  for (const at::Tensor& piece : *pieces) {
    flat.narrow(0, offset, piece.numel()).copy_(piece.reshape({-1}));
    offset += piece.numel();
  }
  return stacked;
}

std::vector<std::pair<std::string, at::Tensor>> CheckpointTensors(const ModelConfig& config,
                                                                  const std::string& name,
                                                                  const at::Tensor& value) {
  const CheckpointPieces pieces = PiecesOf(config, name);
  if (!pieces.stacked) return {{pieces.per_expert.front().front(), value}};
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t e = 0; e < pieces.per_expert.size(); ++e) {
    const std::vector<std::string>& names = pieces.per_expert[e];
    const std::vector<at::Tensor> rows =
        value.select(0, static_cast<int64_t>(e)).chunk(static_cast<int64_t>(names.size()), 0);
    for (size_t i = 0; i < names.size(); ++i) out.emplace_back(names[i], rows[i]);
  }
  return out;
}

}  // namespace ballast::train
