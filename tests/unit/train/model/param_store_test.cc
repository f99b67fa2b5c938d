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

TEST(ParamStore, RefusesDuplicateAndUnknownNames) {
  ParamStore s = ThreeGroups();
  EXPECT_THROW(s.Add("model.norm.weight", torch::ones({4}), ParamStore::kNoLayer, false),
               c10::Error);
  EXPECT_FALSE(s.contains("lm_head.weight"));
  EXPECT_THROW(s.get("lm_head.weight"), c10::Error);
}

}  // namespace
}  // namespace ballast::train
