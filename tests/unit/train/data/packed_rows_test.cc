// Packed rows train exactly as their documents apart: the attention mask the
// kernels compile for a packed row never crosses a document, no target
// crosses one, and the loss of packed rows equals the loss of the same
// documents one per row, on a real (tiny) model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "kernels/cpu/attention_cpu.h"
#include "tests/unit/train/tiny_model.h"
#include "worker/train/data/tokenized_dataset.h"
#include "worker/train/io/file_tree.h"
#include "worker/train/model/decoder.h"
#include "worker/train/model/pretrained.h"
#include "worker/train/objective/causal_lm.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> Values(const at::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

class PackedRowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "packed_rows_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    model_ = WriteTinyQwen3((fs::path(dir_) / "model").string(), /*seed=*/5);
    // Prompts of 3..20 tokens, answers of 1..3, in rows of 64.
    WriteSftSamples(data(), 120, 3, 20, 1, 3, TinyModel::kVocab);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  std::string data() const { return (fs::path(dir_) / "data.jsonl").string(); }

  TokenizedDataset Open(bool packing) {
    absl::StatusOr<DocumentEncoder> encoder =
        DocumentEncoder::Create({.format = DataFormat::kTokens, .vocab_size = TinyModel::kVocab},
                                std::nullopt, std::nullopt);
    EXPECT_TRUE(encoder.ok()) << encoder.status();
    absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
        *encoder, {.data_path = data(), .seq_len = 64, .max_line_bytes = 1 << 20});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return TokenizedDataset(*std::move(cache),
                            {.seq_len = 64, .packing = packing, .shuffle = true, .seed = 9});
  }

  std::string dir_, model_;
};

TEST_F(PackedRowsTest, NoAttentionAndNoTargetCrossesADocument) {
  TokenizedDataset packed = Open(/*packing=*/true);
  ASSERT_LT(packed.rows_per_epoch(), 60);  // several documents to a row
  for (int64_t r = 0; r < packed.rows_per_epoch(); ++r) {
    const PackedBatch b = packed.Pack(r, 1);
    const std::vector<int64_t> cu = Values(b.cu_seqlens);
    const int64_t tokens = cu.back();
    const kernels::IntervalMask mask = kernels::interval_mask(
        {.kind = kernels::MaskKind::kCausal, .cu_seqlens = b.cu_seqlens}, tokens);
    const at::Tensor ranges = mask.key_ranges.contiguous();
    const int64_t* k = ranges.data_ptr<int64_t>();
    const std::vector<int64_t> targets = Values(b.targets);
    const std::vector<int64_t> ids = Values(b.input_ids);
    for (size_t d = 0; d + 1 < cu.size(); ++d) {
      for (int64_t i = cu[d]; i < cu[d + 1]; ++i) {
        // Query i sees exactly the keys [start of its document, i].
        ASSERT_EQ(k[4 * i], cu[d]) << "row " << r << " query " << i;
        ASSERT_EQ(k[4 * i + 1], i + 1) << "row " << r << " query " << i;
        ASSERT_EQ(k[4 * i + 2], k[4 * i + 3]) << "row " << r << " query " << i;
        // Its target is its own document's next token, or none at the end.
        if (i + 1 == cu[d + 1]) {
          ASSERT_EQ(targets[i], -100);
        } else if (targets[i] != -100) {
          ASSERT_EQ(targets[i], ids[i + 1]);
        }
      }
    }
  }
}

TEST_F(PackedRowsTest, PackedLossEqualsTheLossOfTheDocumentsApartAndIsNeverZero) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<ParamStore> params = LoadPretrained(model_, *config, /*trainable=*/false);
  ASSERT_TRUE(params.ok()) << params.status();
  Decoder decoder(*config, &*params, std::nullopt, torch::kFloat, false);
  torch::NoGradGuard no_grad;

  // Over one epoch each: every document once, in rows of several or alone.
  auto epoch_loss = [&](TokenizedDataset& ds) {
    double sum = 0;
    int64_t count = 0;
    for (int64_t r = 0; r < ds.rows_per_epoch(); r += 4) {
      const PackedBatch b = ds.Pack(r, std::min<int64_t>(4, ds.rows_per_epoch() - r));
      const kernels::LossSum ls = CausalLm().Loss(decoder, b, false);
      EXPECT_GT(ls.count.item<int64_t>(), 0);
      EXPECT_GT(ls.sum.item<double>(), 0) << "a packed micro-batch read a loss of 0";
      sum += ls.sum.item<double>();
      count += ls.count.item<int64_t>();
    }
    return std::pair{sum, count};
  };
  TokenizedDataset packed = Open(true), apart = Open(false);
  const auto [packed_sum, packed_count] = epoch_loss(packed);
  const auto [apart_sum, apart_count] = epoch_loss(apart);
  EXPECT_EQ(packed_count, apart_count);
  // fp32 sums in another order: equal to a few ulps of the mean.
  EXPECT_NEAR(packed_sum / packed_count, apart_sum / apart_count, 1e-5 * apart_sum / apart_count);
}

}  // namespace
}  // namespace ballast::train
