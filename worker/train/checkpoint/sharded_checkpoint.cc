#include "worker/train/checkpoint/sharded_checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "worker/train/checkpoint/checkpoint_reader.h"
#include "worker/train/io/safetensors.h"
#include "worker/train/model/rng_state.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// Every rank learns whether any rank failed, so that all return alike and
// none waits at a barrier its peers skipped.
absl::Status Agree(const absl::Status& mine, Collectives* collectives, const std::string& what) {
  const int64_t failed = collectives->Max(mine.ok() ? 0 : 1);
  if (!mine.ok()) return mine;
  if (failed != 0) return absl::InternalError(absl::StrCat(what, " failed on another rank"));
  return absl::OkStatus();
}

nlohmann::json LayoutJson(const FlatLayout& layout) {
  nlohmann::json buckets = nlohmann::json::array();
  for (const FlatBucket& b : layout.buckets) {
    if (!b.trainable) continue;
    nlohmann::json tensors = nlohmann::json::array();
    for (const FlatEntry& e : b.entries) {
      tensors.push_back({{"name", e.name}, {"shape", e.shape}, {"offset", e.offset}});
    }
    buckets.push_back({{"key", b.key()}, {"numel", b.numel}, {"tensors", tensors}});
  }
  return {{"world_size", layout.world_size}, {"buckets", buckets}};
}

}  // namespace

absl::StatusOr<std::string> SaveShardedCheckpoint(
    const std::string& checkpoints_dir, const TrainPosition& position, const ShardedModel& model,
    const AdamW& optimizer, Collectives* collectives, CheckpointHealth health,
    const std::map<std::string, at::Tensor>& buffers) {
  const int rank = collectives->rank();
  // With hybrid sharding every replica holds the same shards: the first
  // replica's ranks write them, as rank-<shard rank>, and the others their
  // generators only, as rng-<rank>.
  const int shard_rank = collectives->shard_group().rank();
  const bool writes_shards =
      collectives->replica_group() == nullptr || collectives->replica_group()->rank() == 0;
  std::map<std::string, at::Tensor> tensors = optimizer.StateDict();
  for (const std::string& key : model.masters().names()) {
    tensors[key] = model.masters().get(key).detach();
  }
  absl::Status finite;
  std::optional<std::string> bad = FirstNonFinite(tensors);
  if (!bad) bad = FirstNonFinite(buffers);
  if (bad) {
    finite = absl::FailedPreconditionError(absl::StrCat("not writing checkpoint at step ",
                                                        position.step, ": ", *bad, " on rank ",
                                                        rank, " is not finite"));
  }
  if (!writes_shards) tensors.clear();
  for (auto& [key, state] : GeneratorStates(model.device())) {
    tensors[CheckpointReader::ShardedGeneratorKey(key)] = state;
  }
  if (absl::Status s = Agree(finite, collectives, "the finite check"); !s.ok()) return s;

  const CheckpointFolder folder = CheckpointFolderFor(checkpoints_dir, position.step);
  absl::Status begun = rank == 0 ? BeginCheckpoint(folder) : absl::OkStatus();
  if (absl::Status s = Agree(begun, collectives, "preparing the checkpoint folder"); !s.ok()) {
    return s;
  }
  const fs::path tmp(folder.tmp_dir);
  absl::Status written =
      WriteSafetensors((tmp / (writes_shards ? CheckpointReader::ShardFileName(shard_rank)
                                             : CheckpointReader::GeneratorFileName(rank)))
                           .string(),
                       tensors);
  if (absl::Status s = Agree(written, collectives, "writing a checkpoint shard"); !s.ok()) {
    // Every rank has stopped writing: rank 0 clears the half-written folder.
    if (rank == 0) AbandonCheckpoint(folder);
    return s;
  }
  absl::Status published;
  if (rank == 0) {
    std::ofstream out(tmp / "layout.json");
    out << LayoutJson(model.layout()).dump();
    out.flush();
    published =
        out ? PublishCheckpoint(folder, position, health, buffers)
            : absl::InternalError(absl::StrCat("cannot write ", folder.tmp_dir, "/layout.json"));
  }
  if (absl::Status s = Agree(published, collectives, "publishing the checkpoint"); !s.ok()) {
    if (rank == 0) AbandonCheckpoint(folder);
    return s;
  }
  return folder.final_dir;
}

namespace {

absl::StatusOr<TrainPosition> LoadShards(const std::string& dir, ShardedModel* model,
                                         AdamW* optimizer, Collectives* collectives) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  // The shard group's ranks (all of them without hybrid sharding) split the
  // buckets; the generator is the rank's own.
  const int n = collectives->shard_group().world_size();
  const int shard_rank = collectives->shard_group().rank();
  std::map<std::string, at::Tensor> state;
  for (const FlatBucket& bucket : model->layout().buckets) {
    if (!bucket.trainable) continue;
    // This rank's elements; the padding past numel stays zero.
    const int64_t s = bucket.shard_numel(n);
    const int64_t lo = std::min(bucket.numel, shard_rank * s);
    const int64_t hi = std::min(bucket.numel, lo + s);
    for (auto part : {CheckpointReader::Part::kParams, CheckpointReader::Part::kExpAvg,
                      CheckpointReader::Part::kExpAvgSq}) {
      absl::StatusOr<at::Tensor> range = reader->Range(bucket, part, lo, hi);
      if (!range.ok()) return range.status();
      at::Tensor shard = torch::zeros({s}, torch::kFloat);
      shard.narrow(0, 0, hi - lo).copy_(*range);
      if (part == CheckpointReader::Part::kParams) {
        model->masters().Assign(bucket.key(), shard);
      } else {
        state[bucket.key() + PartSuffix(part)] = shard;
      }
    }
  }
  state["__step__"] = torch::tensor(reader->optimizer_steps(), torch::kLong);
  if (absl::Status s = optimizer->LoadStateDict(state); !s.ok()) {
    return absl::DataLossError(absl::StrCat(dir, ": ", s.message()));
  }
  absl::StatusOr<std::map<std::string, at::Tensor>> rng =
      reader->GeneratorStates(collectives->rank());
  if (!rng.ok()) return rng.status();
  SetGeneratorStates(*rng, model->device());
  return reader->position();
}

}  // namespace

absl::StatusOr<TrainPosition> LoadShardedCheckpoint(const std::string& dir, ShardedModel* model,
                                                    AdamW* optimizer, Collectives* collectives) {
  absl::StatusOr<TrainPosition> loaded = LoadShards(dir, model, optimizer, collectives);
  if (absl::Status s = Agree(loaded.status(), collectives, "loading the checkpoint"); !s.ok()) {
    return s;
  }
  return loaded;
}

}  // namespace ballast::train
