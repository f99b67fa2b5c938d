// The sharded model on one rank (SingleRank: a gather is a copy) against the
// same decoder over a plain ParamStore: same loss, same gradients, with and
// without activation checkpointing. The multi-process checks are in
// tests/shard/.
#include "worker/train/shard/sharded_model.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "tests/unit/train/tiny_model.h"
#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/model/lora.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/objective/causal_lm.h"
#include "worker/train/shard/flat_layout.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class ShardedModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sharded_model_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/3);
    data_ = WriteTokenData((fs::path(dir_) / "data.jsonl").string(), 8, /*seed=*/4);
    absl::StatusOr<ModelConfig> config = LoadModelConfig(model_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    lora_.r = 4;
    lora_.lora_alpha = 8;
    lora_.target_modules = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"};
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  // The tiny model with LoRA adapters (B drawn at random, so that every
  // gradient is non-zero), or fully trainable.
  ParamStore Model(bool full) {
    absl::StatusOr<ParamStore> params = LoadPretrained(model_, config_, full);
    EXPECT_TRUE(params.ok()) << params.status();
    if (!full) {
      torch::manual_seed(5);
      EXPECT_TRUE(AddLoraAdapters(config_, lora_, &*params).ok());
      torch::NoGradGuard no_grad;
      for (const std::string& name : params->TrainableNames()) {
        at::Tensor p = params->get(name);
        p.normal_(0, 0.1);
      }
    }
    return *std::move(params);
  }

  PackedBatch Batch() {
    absl::StatusOr<TokenizedDataset> data = TokenizedDataset::Load(data_, TinyModel::kVocab, 16);
    EXPECT_TRUE(data.ok()) << data.status();
    return data->Pack(0, 4);
  }

  std::optional<LoraConfig> Lora(bool full) const {
    return full ? std::nullopt : std::optional<LoraConfig>(lora_);
  }

  std::string dir_, model_, data_;
  ModelConfig config_;
  LoraConfig lora_;
};

TEST_F(ShardedModelTest, LayoutGroupsUnitsInForwardOrderAndKeepsOffsetsAcrossWorldSizes) {
  const ParamStore params = Model(/*full=*/false);
  const FlatLayout one = FlatLayout::Plan(params, 1);
  const FlatLayout three = FlatLayout::Plan(params, 3);
  std::vector<std::string> keys;
  for (const FlatBucket& b : one.buckets) keys.push_back(b.key());
  EXPECT_EQ(keys, (std::vector<std::string>{"model.embed_tokens/frozen", "model.layers.0/frozen",
                                            "model.layers.0/trainable", "model.layers.1/frozen",
                                            "model.layers.1/trainable", "model.norm/frozen",
                                            "lm_head/frozen"}));
  ASSERT_EQ(three.buckets.size(), one.buckets.size());
  for (size_t i = 0; i < one.buckets.size(); ++i) {
    const FlatBucket& a = one.buckets[i];
    const FlatBucket& b = three.buckets[i];
    EXPECT_EQ(b.padded % 3, 0);
    EXPECT_GE(b.padded, b.numel);
    EXPECT_LT(b.padded - b.numel, 3);
    int64_t next = 0;
    for (size_t k = 0; k < a.entries.size(); ++k) {
      EXPECT_EQ(a.entries[k].name, b.entries[k].name);
      EXPECT_EQ(a.entries[k].offset, next) << a.entries[k].name;
      EXPECT_EQ(b.entries[k].offset, next);
      next += a.entries[k].numel;
    }
    EXPECT_EQ(next, a.numel);
  }
  // LoRA's A matrices first, so that q/k/v's are adjacent and join as a view.
  const FlatBucket& lora = one.buckets[2];
  EXPECT_EQ(lora.entries[0].name, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(lora.entries[1].name, "model.layers.0.self_attn.k_proj.lora_A.weight");
  EXPECT_EQ(lora.entries[2].name, "model.layers.0.self_attn.v_proj.lora_A.weight");
}

// Each stacked experts tensor is a bucket of its own, after its layer's
// others, so that at a world size dividing E rank r's shard is whole
// experts: unpadded, and the slice [r E / N, (r + 1) E / N) of the tensor.
TEST_F(ShardedModelTest, ExpertsTensorsAreBucketsOfTheirOwnWhoseShardsAreWholeExperts) {
  const std::string moe = WriteTinyQwen3Moe((fs::path(dir_) / "moe").string(), /*seed=*/6);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(moe);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ParamStore> params = LoadPretrained(moe, *config, /*trainable=*/true);
  ASSERT_TRUE(params.ok()) << params.status();
  const int64_t experts = config->moe.num_experts;
  ASSERT_EQ(experts % 2, 0);
  const FlatLayout two = FlatLayout::Plan(*params, 2);
  std::vector<std::string> layer1;
  for (const FlatBucket& b : two.buckets) {
    if (b.layer == 1) layer1.push_back(b.key());
  }
  EXPECT_EQ(layer1, (std::vector<std::string>{"model.layers.1/trainable",
                                              "model.layers.1.mlp.experts.gate_up_proj/trainable",
                                              "model.layers.1.mlp.experts.down_proj/trainable"}));
  for (const FlatBucket& b : two.buckets) {
    if (!b.experts()) {
      for (const FlatEntry& e : b.entries) {
        EXPECT_EQ(e.name.find(".mlp.experts."), std::string::npos) << e.name << " in " << b.key();
      }
      continue;
    }
    ASSERT_EQ(b.entries.size(), 1u) << b.key();
    EXPECT_EQ(b.entries[0].name, b.experts_tensor);
    EXPECT_EQ(b.entries[0].shape[0], experts);
    EXPECT_EQ(b.padded, b.numel) << b.key();
    const at::Tensor full = params->get(b.experts_tensor).reshape({-1});
    for (int rank = 0; rank < 2; ++rank) {
      const at::Tensor shard = full.narrow(0, rank * b.shard_numel(2), b.shard_numel(2));
      const at::Tensor whole =
          params->get(b.experts_tensor).narrow(0, rank * experts / 2, experts / 2).reshape({-1});
      EXPECT_TRUE(torch::equal(shard, whole)) << b.key() << " rank " << rank;
    }
  }
}

// A sharded job maps the checkpoint and copies each rank's ranges: experts
// stored one by one stay their pieces (never stacked whole on a rank), and
// shard to the same values as the stacked copy.
TEST_F(ShardedModelTest, MappedExpertsStayPiecesAndShardAsTheirStackedCopy) {
  const std::string moe = WriteTinyQwen3Moe((fs::path(dir_) / "moe").string(), /*seed=*/6);
  absl::StatusOr<ModelConfig> config = LoadModelConfig(moe);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ParamStore> mapped =
      LoadPretrained(moe, *config, /*trainable=*/true, PretrainedTensors::kMapped);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  absl::StatusOr<ParamStore> owned = LoadPretrained(moe, *config, /*trainable=*/true);
  ASSERT_TRUE(owned.ok()) << owned.status();
  for (const char* stacked : {"gate_up_proj", "down_proj"}) {
    const std::string name = absl::StrCat("model.layers.1.mlp.experts.", stacked);
    EXPECT_TRUE(mapped->get(name).is_meta()) << name;
    EXPECT_EQ(mapped->get(name).sizes(), owned->get(name).sizes()) << name;
  }
  EXPECT_FALSE(mapped->get("model.layers.1.mlp.gate.weight").is_meta());

  SingleRank rank;
  ShardedModel from_pieces(*std::move(mapped), &rank, torch::kFloat, torch::kCPU);
  ShardedModel from_copy(*std::move(owned), &rank, torch::kFloat, torch::kCPU);
  const auto got = from_pieces.GatherFullTensors(/*trainable_only=*/false);
  const auto want = from_copy.GatherFullTensors(/*trainable_only=*/false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(torch::equal(got[i].second, want[i].second)) << got[i].first;
  }
}

TEST_F(ShardedModelTest, OneRankGivesThePlainDecodersLossAndGradients) {
  const PackedBatch batch = Batch();
  for (bool full : {false, true}) {
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "full " << full << " checkpointing " << checkpointing);
      CausalLm objective;
      // The plain decoder.
      ParamStore plain = Model(full);
      const FlatLayout layout = FlatLayout::Plan(plain, 1);
      Decoder reference(config_, &plain, Lora(full), torch::kFloat, checkpointing);
      kernels::LossSum want = objective.Loss(reference, batch, /*training=*/true);
      want.sum.backward();
      std::vector<at::Tensor> want_grads;
      for (const FlatBucket& b : layout.buckets) {
        if (!b.trainable) continue;
        std::vector<at::Tensor> parts;
        for (const FlatEntry& e : b.entries) parts.push_back(plain.get(e.name).grad().reshape(-1));
        want_grads.push_back(torch::cat(parts));
      }

      // The sharded one, over the same weights.
      SingleRank rank;
      ShardedModel sharded(Model(full), &rank, torch::kFloat, torch::kCPU);
      Decoder decoder(config_, &sharded.gathered(), Lora(full), torch::kFloat, checkpointing);
      decoder.set_layer_runner(&sharded);
      sharded.GatherRoots();
      kernels::LossSum got = objective.Loss(decoder, batch, /*training=*/true);
      got.sum.backward();
      sharded.FinishBackward();

      EXPECT_NEAR(got.sum.item<double>(), want.sum.item<double>(),
                  1e-6 * std::abs(want.sum.item<double>()));
      const std::vector<std::string> keys = sharded.masters().names();
      ASSERT_EQ(keys.size(), want_grads.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        const at::Tensor grad = sharded.masters().get(keys[i]).grad();
        ASSERT_TRUE(grad.defined()) << keys[i];
        EXPECT_TRUE(torch::allclose(grad, want_grads[i], 1e-5, 1e-7)) << keys[i];
      }
    }
  }
}

TEST_F(ShardedModelTest, GradientNormsByTensorAreThePlainDecodersPerTensorNorms) {
  const PackedBatch batch = Batch();
  CausalLm objective;
  ParamStore plain = Model(/*full=*/false);
  Decoder reference(config_, &plain, Lora(false), torch::kFloat, false);
  objective.Loss(reference, batch, /*training=*/true).sum.backward();

  SingleRank rank;
  ShardedModel sharded(Model(/*full=*/false), &rank, torch::kFloat, torch::kCPU);
  Decoder decoder(config_, &sharded.gathered(), Lora(false), torch::kFloat, false);
  decoder.set_layer_runner(&sharded);
  sharded.GatherRoots();
  objective.Loss(decoder, batch, /*training=*/true).sum.backward();
  sharded.FinishBackward();

  const auto [names, sums] = sharded.GradSumSquaresByTensor();
  ASSERT_EQ(sums.scalar_type(), torch::kDouble);
  ASSERT_EQ(static_cast<int64_t>(names.size()), sums.numel());
  std::vector<std::string> trainable = plain.TrainableNames();
  std::sort(trainable.begin(), trainable.end());
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, trainable);
  for (size_t i = 0; i < names.size(); ++i) {
    const double want = plain.get(names[i]).grad().to(torch::kDouble).square().sum().item<double>();
    EXPECT_NEAR(sums[i].item<double>(), want, 1e-5 * want + 1e-12) << names[i];
  }
}

TEST_F(ShardedModelTest, AccountsForItsShardsAndGatheredBuffers) {
  const ParamStore plain = Model(/*full=*/false);
  int64_t frozen = 0, trainable = 0;
  for (const std::string& n : plain.names()) {
    (plain.trainable(n) ? trainable : frozen) += plain.get(n).numel();
  }
  SingleRank rank;
  ShardedModel sharded(Model(/*full=*/false), &rank, torch::kFloat, torch::kCPU);
  EXPECT_EQ(sharded.gradient_bytes(), 4 * trainable);
  EXPECT_EQ(sharded.parameter_bytes(), 4 * (trainable + frozen));
  EXPECT_GT(sharded.gathered_buffer_bytes(), 0);
}

}  // namespace
}  // namespace ballast::train
