#include "worker/train/checkpoint/checkpoint_reader.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<nlohmann::json> ReadJson(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return absl::DataLossError(absl::StrCat(path.string(), " is missing"));
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::DataLossError(absl::StrCat(path.string(), " is corrupt"));
  return j;
}

absl::StatusOr<std::shared_ptr<SafetensorsFile>> OpenFile(const fs::path& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path.string());
  if (!f.ok()) return absl::DataLossError(f.status().message());
  return std::shared_ptr<SafetensorsFile>(*std::move(f));
}

// The saved layout from layout.json; nullopt-like empty buckets on a bad file.
absl::StatusOr<FlatLayout> ParseLayout(const nlohmann::json& j, const std::string& where) {
  FlatLayout layout;
  try {
    layout.world_size = j.at("world_size").get<int>();
    if (layout.world_size < 1) throw std::runtime_error("world_size < 1");
    for (const nlohmann::json& b : j.at("buckets")) {
      FlatBucket bucket;
      const std::string key = b.at("key").get<std::string>();
      bucket.trainable = true;
      bucket.unit = key.substr(0, key.rfind('/'));
      bucket.numel = b.at("numel").get<int64_t>();
      for (const nlohmann::json& t : b.at("tensors")) {
        bucket.entries.push_back({t.at("name").get<std::string>(),
                                  t.at("shape").get<std::vector<int64_t>>(),
                                  t.at("offset").get<int64_t>(), 0});
        int64_t numel = 1;
        for (int64_t d : bucket.entries.back().shape) numel *= d;
        bucket.entries.back().numel = numel;
      }
      layout.buckets.push_back(std::move(bucket));
    }
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(where, " is corrupt: ", e.what()));
  }
  return layout.Repadded(layout.world_size);
}

}  // namespace

const char* PartSuffix(CheckpointReader::Part part) {
  switch (part) {
    case CheckpointReader::Part::kExpAvg:
      return ".exp_avg";
    case CheckpointReader::Part::kExpAvgSq:
      return ".exp_avg_sq";
    default:
      return "";
  }
}

absl::StatusOr<TrainPosition> ReadCheckpointPosition(const std::string& dir) {
  absl::StatusOr<nlohmann::json> state = ReadJson(fs::path(dir) / "state.json");
  if (!state.ok()) return state.status();
  if (!state->contains("step") || !state->contains("data_cursor")) {
    return absl::DataLossError(absl::StrCat(dir, "/state.json is missing or corrupt"));
  }
  TrainPosition position;
  position.step = (*state)["step"].get<int64_t>();
  position.data_cursor = (*state)["data_cursor"].get<int64_t>();
  if (state->contains("evaluations")) {
    EvalProgress& eval = position.eval;
    for (const char* key : {"best_step", "best_value", "since_best"}) {
      if (!state->contains(key)) {
        return absl::DataLossError(absl::StrCat(dir, "/state.json has evaluations but no ", key));
      }
    }
    eval.evaluations = (*state)["evaluations"].get<int64_t>();
    eval.best_step = (*state)["best_step"].get<int64_t>();
    eval.best_value = (*state)["best_value"].get<double>();
    eval.since_best = (*state)["since_best"].get<int64_t>();
  }
  return position;
}

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir) {
  const fs::path root(dir);
  CheckpointReader reader;
  reader.dir_ = dir;
  absl::StatusOr<TrainPosition> position = ReadCheckpointPosition(dir);
  if (!position.ok()) return position.status();
  reader.position_ = *position;

  std::error_code ec;
  std::shared_ptr<SafetensorsFile> step_file;
  if (fs::exists(root / "layout.json", ec)) {
    absl::StatusOr<nlohmann::json> j = ReadJson(root / "layout.json");
    if (!j.ok()) return j.status();
    absl::StatusOr<FlatLayout> saved = ParseLayout(*j, dir + "/layout.json");
    if (!saved.ok()) return saved.status();
    reader.saved_ = *std::move(saved);
    reader.world_size_ = reader.saved_.world_size;
    for (int r = 0; r < reader.world_size_; ++r) {
      absl::StatusOr<std::shared_ptr<SafetensorsFile>> f = OpenFile(root / ShardFileName(r));
      if (!f.ok()) return f.status();
      reader.files_.push_back(*std::move(f));
    }
    step_file = reader.files_.front();
  } else {
    for (const char* name : {"params.safetensors", "optimizer.safetensors", "rng.safetensors"}) {
      absl::StatusOr<std::shared_ptr<SafetensorsFile>> f = OpenFile(root / name);
      if (!f.ok()) return f.status();
      reader.files_.push_back(*std::move(f));
    }
    step_file = reader.files_[1];
  }
  absl::StatusOr<at::Tensor> steps = step_file->tensor("__step__");
  if (!steps.ok()) {
    return absl::DataLossError(absl::StrCat(step_file->path(), " has no __step__"));
  }
  reader.optimizer_steps_ = steps->item<int64_t>();
  return reader;
}

absl::Status CheckpointReader::CheckBucket(const FlatBucket& bucket) const {
  for (const FlatBucket& saved : saved_.buckets) {
    if (saved.key() != bucket.key()) continue;
    bool same = saved.numel == bucket.numel && saved.entries.size() == bucket.entries.size();
    for (size_t i = 0; same && i < saved.entries.size(); ++i) {
      same = saved.entries[i].name == bucket.entries[i].name &&
             saved.entries[i].offset == bucket.entries[i].offset &&
             saved.entries[i].shape == bucket.entries[i].shape;
    }
    if (same) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat(dir_, ": ", bucket.key(),
                                            " was saved with other tensors or shapes (another "
                                            "model, adapter or modules_to_save?)"));
  }
  return absl::DataLossError(absl::StrCat(dir_, ": checkpoint has no ", bucket.key()));
}

absl::StatusOr<at::Tensor> CheckpointReader::Range(const FlatBucket& bucket, Part part, int64_t lo,
                                                   int64_t hi) const {
  torch::NoGradGuard no_grad;
  at::Tensor out = torch::empty({hi - lo}, torch::kFloat);
  const std::string suffix = PartSuffix(part);
  if (sharded()) {
    if (absl::Status s = CheckBucket(bucket); !s.ok()) return s;
    const int64_t s_old = (bucket.numel + world_size_ - 1) / world_size_;
    for (int k = 0; k < world_size_; ++k) {
      const int64_t a = std::max(lo, k * s_old), b = std::min(hi, (k + 1) * s_old);
      if (a >= b) continue;
      absl::StatusOr<at::Tensor> t = files_[k]->tensor(bucket.key() + suffix);
      if (!t.ok() || t->numel() != s_old) {
        return absl::DataLossError(absl::StrCat(files_[k]->path(), ": ", bucket.key(), suffix,
                                                " is missing or has another size"));
      }
      out.narrow(0, a - lo, b - a).copy_(t->narrow(0, a - k * s_old, b - a));
    }
    return out;
  }
  const SafetensorsFile& file = part == Part::kParams ? *files_[0] : *files_[1];
  for (const FlatEntry& e : bucket.entries) {
    const int64_t a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel);
    if (a >= b) continue;
    absl::StatusOr<at::Tensor> t = file.tensor(e.name + suffix);
    if (!t.ok() || t->numel() != e.numel) {
      return absl::DataLossError(absl::StrCat(dir_, ": checkpoint has no tensor ", e.name, suffix,
                                              " of ", e.numel, " elements"));
    }
    out.narrow(0, a - lo, b - a).copy_(t->reshape({-1}).narrow(0, a - e.offset, b - a));
  }
  return out;
}

absl::StatusOr<std::map<std::string, at::Tensor>> CheckpointReader::GeneratorStates(
    int rank) const {
  std::shared_ptr<SafetensorsFile> own;
  std::error_code ec;
  if (sharded() && fs::exists(fs::path(dir_) / GeneratorFileName(rank), ec)) {
    absl::StatusOr<std::shared_ptr<SafetensorsFile>> f =
        OpenFile(fs::path(dir_) / GeneratorFileName(rank));
    if (!f.ok()) return f.status();
    own = *std::move(f);
  }
  const SafetensorsFile& file = own         ? *own
                                : sharded() ? *files_[std::min(rank, world_size_ - 1)]
                                            : *files_[2];
  std::map<std::string, at::Tensor> states;
  for (const std::string key : {"cpu", "cuda"}) {
    absl::StatusOr<at::Tensor> t = file.tensor(sharded() ? ShardedGeneratorKey(key) : key);
    if (t.ok()) states[key] = t->clone();
  }
  if (states.count("cpu") == 0) {
    return absl::DataLossError(absl::StrCat(file.path(), " has no generator state"));
  }
  return states;
}

}  // namespace ballast::train
