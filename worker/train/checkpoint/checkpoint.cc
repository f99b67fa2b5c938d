#include "worker/train/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/io/safetensors.h"

namespace ballast::train {
namespace fs = std::filesystem;
namespace {

constexpr char kPrefix[] = "step-";

// The step of a checkpoint folder name, or nullopt for any other name.
std::optional<int64_t> CheckpointStep(const std::string& name) {
  if (name.rfind(kPrefix, 0) != 0) return std::nullopt;
  int64_t step = 0;
  if (!absl::SimpleAtoi(name.substr(sizeof(kPrefix) - 1), &step)) return std::nullopt;
  return step;
}

absl::Status WriteTextAtomically(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp.string()));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(const std::string& checkpoints_dir,
                                           const TrainPosition& position, const ParamStore& params,
                                           const AdamW& optimizer) {
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& name : params.TrainableNames()) {
    const at::Tensor& t = params.get(name);
    if (!torch::isfinite(t).all().item<bool>()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "not writing checkpoint at step ", position.step, ": ", name, " is not finite"));
    }
    tensors[name] = t.detach();
  }
  const fs::path final_dir =
      fs::path(checkpoints_dir) / absl::StrFormat("%s%08d", kPrefix, position.step);
  const fs::path tmp_dir =
      fs::path(checkpoints_dir) / absl::StrCat(".", final_dir.filename().string(), ".tmp");
  if (absl::Status s = RemoveTree(tmp_dir.string()); !s.ok()) return s;
  std::error_code ec;
  fs::create_directories(tmp_dir, ec);
  if (ec)
    return absl::InternalError(
        absl::StrCat("cannot create ", tmp_dir.string(), ": ", ec.message()));

  if (absl::Status s = WriteSafetensors((tmp_dir / "params.safetensors").string(), tensors);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          WriteSafetensors((tmp_dir / "optimizer.safetensors").string(), optimizer.StateDict());
      !s.ok()) {
    return s;
  }
  at::Tensor rng;
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  if (absl::Status s = WriteSafetensors((tmp_dir / "rng.safetensors").string(), {{"cpu", rng}});
      !s.ok()) {
    return s;
  }
  nlohmann::json state = {{"step", position.step}, {"data_cursor", position.data_cursor}};
  if (absl::Status s = WriteTextAtomically(tmp_dir / "state.json", state.dump()); !s.ok()) return s;

  // A folder of the same step from a run that went further before a rollback.
  if (absl::Status s = RemoveTree(final_dir.string()); !s.ok()) return s;
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp_dir.string(), " to ",
                                            final_dir.string(), ": ", ec.message()));
  }
  return final_dir.string();
}

std::optional<std::string> LatestCheckpoint(const std::string& checkpoints_dir) {
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return std::nullopt;
  std::optional<std::string> best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      // An interrupted save; best effort, a leftover is harmless.
      (void)RemoveTree(entry.path().string());
      continue;
    }
    // By number: past 10^8 steps the names outgrow their 8-digit padding.
    const std::optional<int64_t> step = CheckpointStep(name);
    if (!step || !entry.is_directory() || *step <= best_step) continue;
    best_step = *step;
    best = entry.path().string();
  }
  return best;
}

absl::StatusOr<std::optional<std::string>> KeepCheckpointsAtOrBefore(
    const std::string& checkpoints_dir, int64_t max_step) {
  // Also clears interrupted saves, so only complete step-* folders remain.
  (void)LatestCheckpoint(checkpoints_dir);
  std::error_code ec;
  if (!fs::is_directory(checkpoints_dir, ec)) return std::nullopt;
  std::optional<std::string> kept;
  int64_t kept_step = -1;
  std::vector<fs::path> newer;
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::optional<int64_t> step = CheckpointStep(entry.path().filename().string());
    if (!step || !entry.is_directory()) continue;
    if (*step > max_step) {
      newer.push_back(entry.path());
    } else if (*step > kept_step) {
      kept_step = *step;
      kept = entry.path().string();
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", checkpoints_dir));
  for (const fs::path& dir : newer) {
    if (absl::Status s = RemoveTree(dir.string()); !s.ok()) return s;
  }
  return kept;
}

absl::StatusOr<TrainPosition> LoadCheckpoint(const std::string& dir, ParamStore* params,
                                             AdamW* optimizer) {
  const fs::path root(dir);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> p =
      SafetensorsFile::Open((root / "params.safetensors").string());
  if (!p.ok()) return p.status();
  for (const std::string& name : params->TrainableNames()) {
    absl::StatusOr<at::Tensor> t = (*p)->tensor(name);
    if (!t.ok()) {
      return absl::DataLossError(absl::StrCat(dir, ": checkpoint has no tensor ", name));
    }
    params->Assign(name, *t);
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> o =
      SafetensorsFile::Open((root / "optimizer.safetensors").string());
  if (!o.ok()) return o.status();
  std::map<std::string, at::Tensor> state;
  for (const std::string& name : (*o)->names()) state[name] = *(*o)->tensor(name);
  if (absl::Status s = optimizer->LoadStateDict(state); !s.ok()) {
    return absl::DataLossError(absl::StrCat(dir, ": ", s.message()));
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> r =
      SafetensorsFile::Open((root / "rng.safetensors").string());
  if (!r.ok()) return r.status();
  absl::StatusOr<at::Tensor> rng = (*r)->tensor("cpu");
  if (!rng.ok())
    return absl::DataLossError(absl::StrCat(dir, ": rng.safetensors has no cpu state"));
  {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng->clone());
  }
  std::ifstream in(root / "state.json");
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("step") || !j.contains("data_cursor")) {
    return absl::DataLossError(absl::StrCat(dir, "/state.json is missing or corrupt"));
  }
  return TrainPosition{j["step"].get<int64_t>(), j["data_cursor"].get<int64_t>()};
}

}  // namespace ballast::train
