// Block-diffusion SFT through the whole (tiny) model: the mask the kernels
// compile for packed [x_t ; x_0] documents equals its definition, the loss
// equals a float64 reference with the answer count as its denominator, and
// packing short samples several to a row changes nothing (the SDAR failure:
// a packed loss that read 0).
#include "worker/train/objective/block_diffusion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "kernels/cpu/attention_cpu.h"
#include "tests/unit/train/tiny_model.h"
#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/model/pretrained.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMask = TinyModel::kVocab - 1;

class BlockDiffusionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "block_diffusion.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/9);
    // 50 short samples, never the mask token (the last id).
    WriteSftSamples(data(), 50, 2, 10, 1, 6, TinyModel::kVocab - 1);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }
  std::string data() const { return (fs::path(dir_) / "data.jsonl").string(); }

  TokenizedDataset Open(bool packing) {
    absl::StatusOr<DocumentEncoder> encoder =
        DocumentEncoder::Create({.format = DataFormat::kTokens, .vocab_size = TinyModel::kVocab},
                                std::nullopt, std::nullopt);
    EXPECT_TRUE(encoder.ok());
    absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
        *encoder, {.data_path = data(), .seq_len = 32, .max_line_bytes = 1 << 20});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return TokenizedDataset(
        *std::move(cache), {.seq_len = 64,
                            .packing = packing,
                            .shuffle = true,
                            .seed = 3,
                            .diffusion = {.block_length = 4, .mask_token_id = kMask, .eps = 1e-3}});
  }

  std::string dir_, model_;
};

// The definition (shared/REFERENCES.md, SDAR's block_diff_mask) for one
// document of halves of n tokens.
bool Sees(int64_t q, int64_t k, int64_t n, int64_t b) {
  const bool q_clean = q >= n, k_clean = k >= n;
  const int64_t bq = (q_clean ? q - n : q) / b, bk = (k_clean ? k - n : k) / b;
  if (q_clean == k_clean && bq == bk) return true;
  if (!q_clean && k_clean) return bq > bk;
  if (q_clean && k_clean) return bq >= bk;
  return false;
}

TEST_F(BlockDiffusionTest, TheKernelsMaskOfPackedRowsIsTheDefinition) {
  TokenizedDataset ds = Open(/*packing=*/true);
  for (int64_t r = 0; r < ds.rows_per_epoch(); ++r) {
    const PackedBatch b = ds.Pack(r, 1);
    ASSERT_EQ(b.mask.kind, kernels::MaskKind::kBlockDiffusion);
    const at::Tensor cu = b.cu_seqlens;
    const int64_t total = cu[-1].item<int64_t>();
    const kernels::IntervalMask mask = kernels::interval_mask(
        {.kind = kernels::MaskKind::kBlockDiffusion, .cu_seqlens = cu, .block_size = 4}, total);
    const at::Tensor ranges = mask.key_ranges.contiguous();
    const int64_t* k = ranges.data_ptr<int64_t>();
    for (int64_t d = 0; d + 1 < cu.numel(); ++d) {
      const int64_t begin = cu[d].item<int64_t>(), end = cu[d + 1].item<int64_t>();
      const int64_t n = (end - begin) / 2;
      for (int64_t q = begin; q < end; ++q) {
        for (int64_t key = 0; key < total; ++key) {
          const bool kernel = (key >= k[4 * q] && key < k[4 * q + 1]) ||
                              (key >= k[4 * q + 2] && key < k[4 * q + 3]);
          const bool definition = key >= begin && key < end && Sees(q - begin, key - begin, n, 4);
          ASSERT_EQ(kernel, definition) << "row " << r << " query " << q << " key " << key;
        }
      }
    }
  }
}

TEST_F(BlockDiffusionTest, LossIsTheFloat64ReferenceOverAnswersAndPackingChangesNothing) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_);
  ASSERT_TRUE(config.ok());
  absl::StatusOr<ParamStore> params = LoadPretrained(model_, *config, /*trainable=*/false);
  ASSERT_TRUE(params.ok());
  Decoder decoder(*config, &*params, std::nullopt, torch::kFloat, false);
  torch::NoGradGuard no_grad;
  BlockDiffusion objective;

  auto epoch = [&](TokenizedDataset& ds) {
    double sum = 0, reference = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < ds.rows_per_epoch(); r += 2) {
      const PackedBatch b = ds.Pack(r, std::min<int64_t>(2, ds.rows_per_epoch() - r));
      const kernels::LossSum loss = objective.Loss(decoder, b, false);
      EXPECT_GT(loss.sum.item<double>(), 0) << "a block-diffusion micro-batch read a loss of 0";
      EXPECT_EQ(loss.count.item<int64_t>(), b.supervised_tokens);
      EXPECT_EQ(objective.Targets(b), b.supervised_tokens);
      // Σ over masked answers of CE(own token) / p, from full float64 logits.
      const at::Tensor logits = decoder.Logits(b).to(torch::kDouble);
      const at::Tensor masked = b.targets.ne(-100).nonzero().squeeze(1);
      const at::Tensor lse = torch::logsumexp(logits.index_select(0, masked), 1);
      const at::Tensor own =
          logits.index_select(0, masked).gather(1, b.targets.index_select(0, masked).unsqueeze(1));
      reference +=
          ((lse - own.squeeze(1)) * b.loss_weights.index_select(0, masked).to(torch::kDouble))
              .sum()
              .item<double>();
      sum += loss.sum.item<double>();
      count += loss.count.item<int64_t>();
    }
    return std::tuple{sum, reference, count};
  };
  TokenizedDataset packed = Open(true), apart = Open(false);
  ASSERT_LT(packed.rows_per_epoch(), 50);
  const auto [packed_sum, packed_reference, packed_count] = epoch(packed);
  const auto [apart_sum, apart_reference, apart_count] = epoch(apart);
  EXPECT_NEAR(packed_sum, packed_reference, 1e-4 * packed_reference);
  // Every answer token counts once, masked or not.
  EXPECT_EQ(packed_count, apart_count);
  // The same masks (drawn per epoch and document) in other rows: the same
  // loss, to fp32 summation order.
  EXPECT_NEAR(packed_sum / packed_count, apart_sum / apart_count, 1e-4 * apart_sum / apart_count);
}

}  // namespace
}  // namespace ballast::train
