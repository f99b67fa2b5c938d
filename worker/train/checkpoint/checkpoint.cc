#include "worker/train/checkpoint/checkpoint.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/train/checkpoint/checkpoint_reader.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/rng_state.h"

namespace ballast::train {
namespace fs = std::filesystem;
namespace {

constexpr char kPrefix[] = "step-";
constexpr char kUnverified[] = "UNVERIFIED";
constexpr char kBuffersFile[] = "buffers.safetensors";

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

CheckpointFolder CheckpointFolderFor(const std::string& checkpoints_dir, int64_t step) {
  const fs::path final_dir = fs::path(checkpoints_dir) / absl::StrFormat("%s%08d", kPrefix, step);
  return {final_dir.string(),
          (fs::path(checkpoints_dir) / absl::StrCat(".", final_dir.filename().string(), ".tmp"))
              .string()};
}

absl::Status BeginCheckpoint(const CheckpointFolder& folder) {
  if (absl::Status s = RemoveTree(folder.tmp_dir); !s.ok()) return s;
  std::error_code ec;
  fs::create_directories(folder.tmp_dir, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot create ", folder.tmp_dir, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status PublishCheckpoint(const CheckpointFolder& folder, const TrainPosition& position,
                               CheckpointHealth health,
                               const std::map<std::string, at::Tensor>& buffers) {
  if (!buffers.empty()) {
    if (absl::Status s =
            WriteSafetensors((fs::path(folder.tmp_dir) / kBuffersFile).string(), buffers);
        !s.ok()) {
      return s;
    }
  }
  nlohmann::json state = {{"step", position.step}, {"data_cursor", position.data_cursor}};
  if (const EvalProgress& eval = position.eval; eval.evaluations > 0) {
    // nlohmann writes a double with the digits that read back as it.
    state["evaluations"] = eval.evaluations;
    state["best_step"] = eval.best_step;
    state["best_value"] = eval.best_value;
    state["since_best"] = eval.since_best;
  }
  if (absl::Status s = WriteTextAtomically(fs::path(folder.tmp_dir) / "state.json", state.dump());
      !s.ok()) {
    return s;
  }
  if (health == CheckpointHealth::kUnverified) {
    if (absl::Status s = WriteTextAtomically(
            fs::path(folder.tmp_dir) / kUnverified,
            "not yet followed by guard.good_after_steps clean steps; resume passes it by\n");
        !s.ok()) {
      return s;
    }
  }
  // A folder of the same step from a run that went further before a rollback.
  if (absl::Status s = RemoveTree(folder.final_dir); !s.ok()) return s;
  std::error_code ec;
  fs::rename(folder.tmp_dir, folder.final_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot rename ", folder.tmp_dir, " to ",
                                            folder.final_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

std::optional<std::string> FirstNonFinite(const std::map<std::string, at::Tensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (t.is_floating_point() && !torch::isfinite(t).all().item<bool>()) return name;
  }
  return std::nullopt;
}

absl::StatusOr<std::string> SaveCheckpoint(const std::string& checkpoints_dir,
                                           const TrainPosition& position, const ParamStore& params,
                                           const AdamW& optimizer, CheckpointHealth health,
                                           const std::map<std::string, at::Tensor>& buffers) {
  std::map<std::string, at::Tensor> tensors;
  for (const std::string& name : params.TrainableNames()) tensors[name] = params.get(name).detach();
  const std::map<std::string, at::Tensor> optimizer_state = optimizer.StateDict();
  std::optional<std::string> bad = FirstNonFinite(tensors);
  if (!bad) bad = FirstNonFinite(optimizer_state);
  if (!bad) bad = FirstNonFinite(buffers);
  if (bad) {
    return absl::FailedPreconditionError(absl::StrCat("not writing checkpoint at step ",
                                                      position.step, ": ", *bad, " is not finite"));
  }
  const CheckpointFolder folder = CheckpointFolderFor(checkpoints_dir, position.step);
  if (absl::Status s = BeginCheckpoint(folder); !s.ok()) return s;
  const fs::path tmp(folder.tmp_dir);
  auto write = [&]() -> absl::Status {
    if (absl::Status s = WriteSafetensors((tmp / "params.safetensors").string(), tensors);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            WriteSafetensors((tmp / "optimizer.safetensors").string(), optimizer_state);
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            WriteSafetensors((tmp / "rng.safetensors").string(), GeneratorStates(params.device()));
        !s.ok()) {
      return s;
    }
    return PublishCheckpoint(folder, position, health, buffers);
  };
  if (absl::Status s = write(); !s.ok()) {
    AbandonCheckpoint(folder);
    return s;
  }
  return folder.final_dir;
}

void AbandonCheckpoint(const CheckpointFolder& folder) {
  // Best effort: the write's own error is what the caller reports.
  RemoveTree(folder.tmp_dir).IgnoreError();
}

std::optional<int64_t> CheckpointStepOf(const std::string& dir) {
  return CheckpointStep(fs::path(dir).filename().string());
}

bool IsGoodCheckpoint(const std::string& dir) {
  std::error_code ec;
  return !fs::exists(fs::path(dir) / kUnverified, ec);
}

absl::Status MarkCheckpointGood(const std::string& dir) {
  std::error_code ec;
  fs::remove(fs::path(dir) / kUnverified, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot mark ", dir, " good (remove ", kUnverified, "): ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status RotateCheckpoints(const std::string& checkpoints_dir, int64_t keep,
                               absl::Span<const int64_t> best_steps) {
  if (keep <= 0) return absl::OkStatus();
  std::error_code ec;
  std::vector<std::pair<int64_t, fs::path>> all;  // (step, folder)
  for (const auto& entry : fs::directory_iterator(checkpoints_dir, ec)) {
    const std::optional<int64_t> step = CheckpointStep(entry.path().filename().string());
    if (step && entry.is_directory()) all.emplace_back(*step, entry.path());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", checkpoints_dir));
  std::sort(all.begin(), all.end(), std::greater<>());
  std::set<int64_t> protected_steps(best_steps.begin(), best_steps.end());
  bool good_kept = false;
  // Newest first: a kept checkpoint protects the best it names before that
  // one's turn comes (a best is never newer than the checkpoint naming it).
  for (size_t i = 0; i < all.size(); ++i) {
    const bool good = IsGoodCheckpoint(all[i].second.string());
    if (static_cast<int64_t>(i) < keep || (good && !good_kept) ||
        protected_steps.contains(all[i].first)) {
      good_kept = good_kept || good;
      // A folder whose state.json cannot be read names no best: loading it
      // fails anyway, with DATA_LOSS naming the file.
      absl::StatusOr<TrainPosition> kept = ReadCheckpointPosition(all[i].second.string());
      if (kept.ok() && kept->eval.best_step >= 0) protected_steps.insert(kept->eval.best_step);
      continue;
    }
    if (absl::Status s = RemoveTree(all[i].second.string()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::optional<std::string> LatestCheckpoint(const std::string& checkpoints_dir, int64_t max_step) {
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
    if (!step || !entry.is_directory() || *step <= best_step || *step > max_step) continue;
    if (!IsGoodCheckpoint(entry.path().string())) continue;
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
    } else if (*step > kept_step && IsGoodCheckpoint(entry.path().string())) {
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
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  // Whole tensors, one bucket at a time, from either layout: a job of one
  // rank resumes a sharded job's checkpoint too.
  std::map<std::string, at::Tensor> state;
  for (const FlatBucket& bucket : FlatLayout::Plan(*params, 1).buckets) {
    if (!bucket.trainable) continue;
    for (auto part : {CheckpointReader::Part::kParams, CheckpointReader::Part::kExpAvg,
                      CheckpointReader::Part::kExpAvgSq}) {
      absl::StatusOr<at::Tensor> flat = reader->Range(bucket, part, 0, bucket.numel);
      if (!flat.ok()) return flat.status();
      for (const FlatEntry& e : bucket.entries) {
        at::Tensor t = flat->narrow(0, e.offset, e.numel).view(e.shape);
        if (part == CheckpointReader::Part::kParams) {
          params->Assign(e.name, t);
        } else {
          state[e.name + PartSuffix(part)] = t;
        }
      }
    }
  }
  state["__step__"] = torch::tensor(reader->optimizer_steps(), torch::kLong);
  if (absl::Status s = optimizer->LoadStateDict(state); !s.ok()) {
    return absl::DataLossError(absl::StrCat(dir, ": ", s.message()));
  }
  absl::StatusOr<std::map<std::string, at::Tensor>> rng = reader->GeneratorStates(0);
  if (!rng.ok()) return rng.status();
  SetGeneratorStates(*rng, params->device());
  return reader->position();
}

absl::StatusOr<std::map<std::string, at::Tensor>> LoadCheckpointBuffers(const std::string& dir) {
  const fs::path path = fs::path(dir) / kBuffersFile;
  std::map<std::string, at::Tensor> buffers;
  std::error_code ec;
  if (!fs::exists(path, ec)) return buffers;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path.string());
  if (!file.ok()) return absl::DataLossError(file.status().message());
  for (const std::string& name : (*file)->names()) {
    absl::StatusOr<at::Tensor> t = (*file)->tensor(name);
    if (!t.ok()) return absl::DataLossError(t.status().message());
    buffers[name] = t->clone();
  }
  return buffers;
}

}  // namespace ballast::train
