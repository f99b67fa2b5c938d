#include "worker/train/model/param_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

namespace ballast::train {
namespace {

using ::testing::ElementsAre;

ParamStore ThreeGroups() {
  ParamStore s;
  s.Add("model.embed_tokens.weight", torch::zeros({8, 4}), ParamStore::kNoLayer, false);
  s.Add("model.layers.0.q.weight", torch::zeros({4, 4}), 0, false);
  s.Add("model.layers.0.q.lora_A.weight", torch::zeros({2, 4}), 0, true);
  s.Add("model.layers.1.q.weight", torch::zeros({4, 4}), 1, false);
  s.Add("model.norm.weight", torch::ones({4}), ParamStore::kNoLayer, false);
  return s;
}

TEST(ParamStore, KeepsInsertionOrderAndGroupsByLayer) {
  ParamStore s = ThreeGroups();
  EXPECT_THAT(s.names(), ElementsAre("model.embed_tokens.weight", "model.layers.0.q.weight",
                                     "model.layers.0.q.lora_A.weight", "model.layers.1.q.weight",
                                     "model.norm.weight"));
  EXPECT_THAT(s.LayerNames(0),
              ElementsAre("model.layers.0.q.weight", "model.layers.0.q.lora_A.weight"));
  EXPECT_THAT(s.LayerNames(ParamStore::kNoLayer),
              ElementsAre("model.embed_tokens.weight", "model.norm.weight"));
  EXPECT_EQ(s.num_layers(), 2);
  EXPECT_EQ(s.Numel(), 32 + 16 + 8 + 16 + 4);
  EXPECT_EQ(s.TrainableNumel(), 8);
}

TEST(ParamStore, TrainableTensorsRequireGradAndFrozenOnesDoNot) {
  ParamStore s = ThreeGroups();
  EXPECT_THAT(s.TrainableNames(), ElementsAre("model.layers.0.q.lora_A.weight"));
  EXPECT_TRUE(s.get("model.layers.0.q.lora_A.weight").requires_grad());
  EXPECT_FALSE(s.get("model.embed_tokens.weight").requires_grad());
  s.SetTrainable("model.embed_tokens.weight");
  EXPECT_TRUE(s.trainable("model.embed_tokens.weight"));
  EXPECT_TRUE(s.get("model.embed_tokens.weight").requires_grad());
  EXPECT_THAT(s.TrainableNames(),
              ElementsAre("model.embed_tokens.weight", "model.layers.0.q.lora_A.weight"));
}

TEST(ParamStore, AssignWritesInPlaceAndKeepsRequiresGrad) {
  ParamStore s = ThreeGroups();
  const void* storage = s.get("model.layers.0.q.lora_A.weight").data_ptr();
  s.Assign("model.layers.0.q.lora_A.weight", torch::full({2, 4}, 3.0));
  const at::Tensor& t = s.get("model.layers.0.q.lora_A.weight");
  EXPECT_EQ(t.data_ptr(), storage);
  EXPECT_TRUE(t.requires_grad());
  EXPECT_EQ(t.sum().item<float>(), 24.0f);
}

TEST(ParamStore, MoveToKeepsTrainableMastersInFp32AndFrozenWeightsInTheComputeDtype) {
  ParamStore s = ThreeGroups();
  const at::Tensor embed = s.get("model.embed_tokens.weight").clone();
  s.MoveTo(c10::kCPU, torch::kBFloat16);
  EXPECT_EQ(s.device(), c10::Device(c10::kCPU));
  const at::Tensor& frozen = s.get("model.embed_tokens.weight");
  EXPECT_EQ(frozen.scalar_type(), torch::kBFloat16);
  EXPECT_FALSE(frozen.requires_grad());
  EXPECT_TRUE(torch::equal(frozen, embed.to(torch::kBFloat16)));
  const at::Tensor& trained = s.get("model.layers.0.q.lora_A.weight");
  EXPECT_EQ(trained.scalar_type(), torch::kFloat);
  EXPECT_TRUE(trained.requires_grad());
  EXPECT_TRUE(trained.is_leaf());
  if (torch::cuda::is_available()) {
    s.MoveTo(c10::Device(c10::kCUDA, 0), torch::kBFloat16);
    EXPECT_TRUE(s.get("model.layers.0.q.lora_A.weight").is_cuda());
    EXPECT_TRUE(s.get("model.layers.0.q.lora_A.weight").is_leaf());
    EXPECT_EQ(s.device(), c10::Device(c10::kCUDA, 0));
  }
}

// Experts kept as the checkpoint's per-expert pieces: every range a shard
// can take, across piece boundaries, equals the stacked tensor's.
TEST(ParamStore, PiecesGiveTheStackedTensorsRangesWithoutStackingIt) {
  at::Tensor stacked = torch::randn({3, 4, 5}, torch::kBFloat16);  // 3 experts, gate and up rows
  std::vector<at::Tensor> pieces;
  for (at::Tensor expert : stacked.unbind(0)) {
    for (at::Tensor rows : expert.chunk(2, 0)) pieces.push_back(rows.clone());
  }
  ParamStore s;
  s.AddPieces("model.layers.0.mlp.experts.gate_up_proj", {3, 4, 5}, pieces, 0, true);
  const at::Tensor& meta = s.get("model.layers.0.mlp.experts.gate_up_proj");
  EXPECT_TRUE(meta.is_meta());
  EXPECT_EQ(meta.sizes(), stacked.sizes());
  EXPECT_EQ(meta.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(meta.requires_grad());
  EXPECT_EQ(s.Numel(), 60);
  const at::Tensor flat = stacked.reshape({-1}).to(torch::kFloat);
  for (int64_t begin = 0; begin < 60; begin += 7) {
    for (const int64_t length : std::initializer_list<int64_t>{1, 9, 23, 60 - begin}) {
      if (begin + length > 60) continue;
      at::Tensor out = torch::full({length}, -1.0f);
      s.CopyFlatRange("model.layers.0.mlp.experts.gate_up_proj", begin, out);
      EXPECT_TRUE(torch::equal(out, flat.narrow(0, begin, length))) << begin << "+" << length;
    }
  }
  EXPECT_THROW(s.MoveTo(c10::kCPU, torch::kFloat), c10::Error);
}

TEST(ParamStore, PiecesMustHoldTheShapesElements) {
  ParamStore s;
  EXPECT_THROW(s.AddPieces("x", {2, 3}, {torch::zeros({2, 2})}, 0, false), c10::Error);
  EXPECT_THROW(s.AddPieces("y", {2, 3}, {}, 0, false), c10::Error);
  at::Tensor out = torch::zeros({4});
  s.Add("z", torch::arange(6, torch::kFloat), 0, false);
  s.CopyFlatRange("z", 2, out);
  EXPECT_TRUE(torch::equal(out, torch::arange(2, 6, torch::kFloat)));
}

TEST(ParamStore, RefusesDuplicateAndUnknownNames) {
  ParamStore s = ThreeGroups();
  EXPECT_THROW(s.Add("model.norm.weight", torch::ones({4}), ParamStore::kNoLayer, false),
               c10::Error);
  EXPECT_FALSE(s.contains("lm_head.weight"));
  EXPECT_THROW(s.get("lm_head.weight"), c10::Error);
}

}  // namespace
}  // namespace ballast::train
