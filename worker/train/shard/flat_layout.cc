#include "worker/train/shard/flat_layout.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "common/model_config.h"
#include "worker/train/model/expert_layout.h"
#include "worker/train/model/tensor_names.h"

namespace ballast::train {
namespace {

// The unit a tensor outside the layers belongs to: its name without ".weight".
std::string RootUnit(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// A's before B's, each in the ParamStore's order; base tensors first.
int LoraRank(const std::string& name) {
  if (absl::StrContains(name, ".lora_A.")) return 1;
  if (absl::StrContains(name, ".lora_B.")) return 2;
  return 0;
}

int64_t RoundUp(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

}  // namespace

FlatLayout FlatLayout::Plan(const ParamStore& params, int world_size) {
  FlatLayout layout;
  layout.world_size = world_size;
  std::vector<std::string> units;  // in first-seen order
  std::map<std::string, int64_t> unit_layer;
  std::map<std::pair<std::string, bool>, std::vector<std::string>> members;
  auto add = [&](const std::string& name, const std::string& unit, int64_t layer) {
    if (!unit_layer.count(unit)) {
      units.push_back(unit);
      unit_layer[unit] = layer;
    }
    members[{unit, params.trainable(name)}].push_back(name);
  };
  // Embeddings first, then layers in order, then the remaining root tensors:
  // the order in which a forward uses them.
  std::vector<std::string> roots = params.LayerNames(ParamStore::kNoLayer);
  for (const std::string& name : roots) {
    if (RootUnit(name) == "model.embed_tokens") add(name, RootUnit(name), ParamStore::kNoLayer);
  }
  for (int64_t layer = 0; layer < params.num_layers(); ++layer) {
    std::string unit = LayerPrefix(layer);
    unit.pop_back();  // the trailing '.'
    for (const std::string& name : params.LayerNames(layer)) add(name, unit, layer);
  }
  for (const std::string& name : roots) {
    if (RootUnit(name) != "model.embed_tokens") add(name, RootUnit(name), ParamStore::kNoLayer);
  }

  for (const std::string& unit : units) {
    const int64_t layer = unit_layer[unit];
    for (bool trainable : {false, true}) {
      auto it = members.find({unit, trainable});
      if (it == members.end()) continue;
      std::vector<std::string> names = it->second;
      std::stable_sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
        return LoraRank(a) < LoraRank(b);
      });
      // The unit's tensors in one bucket, then each stacked experts tensor
      // in its own.
      auto is_experts = [&](const std::string& name) {
        return layer != ParamStore::kNoLayer && absl::StartsWith(name, ExpertsPrefix(layer));
      };
      std::vector<std::vector<std::string>> groups(1);
      for (const std::string& name : names) {
        if (is_experts(name)) {
          groups.push_back({name});
        } else {
          groups[0].push_back(name);
        }
      }
      for (const std::vector<std::string>& group : groups) {
        if (group.empty()) continue;
        FlatBucket bucket;
        bucket.unit = unit;
        bucket.layer = layer;
        bucket.trainable = trainable;
        if (is_experts(group[0])) bucket.experts_tensor = group[0];
        for (const std::string& name : group) {
          const at::Tensor& t = params.get(name);
          bucket.entries.push_back({name, t.sizes().vec(), bucket.numel, t.numel()});
          bucket.numel += t.numel();
        }
        bucket.padded = RoundUp(bucket.numel, world_size);
        layout.buckets.push_back(std::move(bucket));
      }
    }
  }
  return layout;
}

FlatLayout FlatLayout::Repadded(int new_world_size) const {
  FlatLayout out = *this;
  out.world_size = new_world_size;
  for (FlatBucket& b : out.buckets) b.padded = RoundUp(b.numel, new_world_size);
  return out;
}

}  // namespace ballast::train
