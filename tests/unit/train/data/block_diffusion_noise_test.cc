#include "worker/train/data/block_diffusion_noise.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

#include "worker/train/data/document_encoder.h"

namespace ballast::train {
namespace {

TEST(BlockDiffusionNoiseTest, MasksOnlyAnswersAndPredictsEachOwnTokenWeightedByOneOverP) {
  std::mt19937_64 rng(std::random_device{}());
  const DiffusionNoise noise{.block_length = 4, .mask_token_id = 99, .eps = 1e-3};
  int64_t masked_total = 0, answers_total = 0;
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 30);
    const int prompt = static_cast<int>(rng() % n);
    std::vector<int32_t> ids(n), labels(n);
    for (int i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>(rng() % 90);
      labels[i] = i < prompt ? kIgnoreLabel : ids[i];
    }
    NoisedTokens out;
    const int64_t answers = AppendNoisedDocument(ids, labels, noise, rng(), &out);
    ASSERT_EQ(answers, n - prompt);
    ASSERT_EQ(out.ids.size(), 2u * n);
    int masked = 0;
    float weight = 0;
    for (int i = 0; i < n; ++i) {
      // x_t: a masked position holds the mask token and predicts its own
      // clean token; the prompt is never masked.
      if (out.ids[i] == 99) {
        ASSERT_GE(i, prompt);
        ASSERT_EQ(out.targets[i], ids[i]);
        ASSERT_GE(out.weights[i], 1.0f);
        ASSERT_LE(out.weights[i], 1000.0f + 1e-3f);
        if (weight != 0) ASSERT_EQ(out.weights[i], weight);  // one p per document
        weight = out.weights[i];
        ++masked;
      } else {
        ASSERT_EQ(out.ids[i], ids[i]);
        ASSERT_EQ(out.targets[i], kIgnoreLabel);
        ASSERT_EQ(out.weights[i], 0.0f);
      }
      // x_0: clean, trains nothing; positions restart in each half.
      ASSERT_EQ(out.ids[n + i], ids[i]);
      ASSERT_EQ(out.targets[n + i], kIgnoreLabel);
      ASSERT_EQ(out.positions[i], i);
      ASSERT_EQ(out.positions[n + i], i);
    }
    // At least one answer is masked, whatever p drew.
    ASSERT_GE(masked, answers > 0 ? 1 : 0);
    masked_total += masked;
    answers_total += answers;
  }
  // E[p] = (1 - eps) / 2 + eps, about half the answers (more, for the floor
  // of one per document).
  EXPECT_GT(static_cast<double>(masked_total) / answers_total, 0.4);
  EXPECT_LT(static_cast<double>(masked_total) / answers_total, 0.7);
}

TEST(BlockDiffusionNoiseTest, TheSameSeedDrawsTheSameMasks) {
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> labels = {-100, -100, 3, 4, 5, 6, 7, 8};
  const DiffusionNoise noise{.block_length = 2, .mask_token_id = 0};
  NoisedTokens a, b, c;
  AppendNoisedDocument(ids, labels, noise, 42, &a);
  AppendNoisedDocument(ids, labels, noise, 42, &b);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.weights, b.weights);
  bool differs = false;
  for (uint64_t seed = 43; seed < 60 && !differs; ++seed) {
    c = {};
    AppendNoisedDocument(ids, labels, noise, seed, &c);
    differs = c.ids != a.ids;
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace ballast::train
