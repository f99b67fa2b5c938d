#include "worker/train/data/step_batches.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class StepBatchesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "step_batches_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    // 13 documents of 2..6 tokens, each token its document's index, so a
    // batch says which documents it holds.
    std::ofstream out(path());
    for (int d = 0; d < 13; ++d) {
      out << "{\"input_ids\": [" << d;
      for (int t = 1; t < 2 + d % 5; ++t) out << ", " << d;
      out << "]}\n";
    }
  }
  // remove_all would bind to a copy libtorch.so exports, which crashes.
  void TearDown() override { fs::remove(path()), fs::remove(dir_); }
  std::string path() const { return (fs::path(dir_) / "data.jsonl").string(); }

  // Shuffled and packed into rows of 8 tokens, seed 7.
  TokenizedDataset Load() {
    absl::StatusOr<DocumentEncoder> encoder = DocumentEncoder::Create(
        {.format = DataFormat::kTokens, .vocab_size = 16}, std::nullopt, std::nullopt);
    EXPECT_TRUE(encoder.ok()) << encoder.status();
    absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
        *encoder, {.data_path = path(), .seq_len = 8, .max_line_bytes = 1 << 20});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return TokenizedDataset(*std::move(cache),
                            {.seq_len = 8, .packing = true, .shuffle = true, .seed = 7});
  }

  std::string dir_;
};

void ExpectSameBatches(const std::vector<PackedBatch>& got, const std::vector<PackedBatch>& want,
                       const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(torch::equal(got[i].input_ids, want[i].input_ids)) << where << " batch " << i;
    EXPECT_TRUE(torch::equal(got[i].position_ids, want[i].position_ids)) << where;
    EXPECT_TRUE(torch::equal(got[i].targets, want[i].targets)) << where;
    EXPECT_TRUE(torch::equal(got[i].cu_seqlens, want[i].cu_seqlens)) << where;
    EXPECT_EQ(got[i].document_ids, want[i].document_ids) << where;
    EXPECT_EQ(got[i].supervised_tokens, want[i].supervised_tokens) << where;
  }
}

TEST_F(StepBatchesTest, PackedAheadOrNotEveryRankGetsItsShareOfEveryStep) {
  // 2 rows per micro-batch, 4 micro-batches per step, over 2 ranks: rank r
  // takes micro-batches r and r + 2, across epochs (13 documents in fewer
  // rows).
  for (int rank = 0; rank < 2; ++rank) {
    TokenizedDataset ahead_data = Load(), plain_data = Load();
    StepBatches ahead(&ahead_data, {2, 4, rank, 2, c10::kCPU});
    ASSERT_EQ(ahead.rows_per_step(), 8);
    // A rollback's jump back (cursor 8 again) and a resume's jump forward
    // (40) are packed on the spot; the steady steps come from the packer.
    for (int64_t cursor : {0, 8, 16, 8, 16, 40, 48}) {
      std::vector<PackedBatch> want;
      for (int64_t i = rank; i < 4; i += 2) want.push_back(plain_data.Pack(cursor + 2 * i, 2));
      ExpectSameBatches(ahead.Take(cursor), want, absl::StrCat("rank ", rank, " cursor ", cursor));
    }
  }
}

TEST_F(StepBatchesTest, AResumeAtAnyWorldSizeTakesTheRowsOfAnUninterruptedRun) {
  // The uninterrupted run: one rank, 10 steps of 4 micro-batches of 1 row.
  TokenizedDataset straight_data = Load();
  StepBatches straight(&straight_data, {1, 4, 0, 1, c10::kCPU});
  std::vector<std::vector<PackedBatch>> steps;
  for (int64_t step = 0; step < 10; ++step) steps.push_back(straight.Take(4 * step));
  // Resumed from the cursor a checkpoint after step 6 keeps, on fresh
  // datasets (a new process), at world sizes 1 and 2: rank r's micro-batches
  // are the uninterrupted run's r, r + N, ...
  for (int world = 1; world <= 2; ++world) {
    for (int rank = 0; rank < world; ++rank) {
      TokenizedDataset resumed_data = Load();
      StepBatches resumed(&resumed_data, {1, 4, rank, world, c10::kCPU});
      for (int64_t step = 6; step < 10; ++step) {
        std::vector<PackedBatch> want;
        for (int i = rank; i < 4; i += world) want.push_back(steps[step][i]);
        ExpectSameBatches(resumed.Take(4 * step), want,
                          absl::StrCat("world ", world, " rank ", rank, " step ", step));
      }
    }
  }
}

TEST_F(StepBatchesTest, AGpuGetsItsBatchOnTheDeviceAndTheMaskOnTheHost) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  TokenizedDataset data = Load();
  StepBatches batches(&data, {3, 2, 0, 1, c10::Device(c10::kCUDA, 0)});
  for (int64_t cursor : {0, 6, 12}) {
    for (const PackedBatch& b : batches.Take(cursor)) {
      EXPECT_TRUE(b.input_ids.is_cuda());
      EXPECT_TRUE(b.position_ids.is_cuda());
      EXPECT_TRUE(b.targets.is_cuda());
      EXPECT_TRUE(b.cu_seqlens.is_cpu());
    }
  }
}

}  // namespace
}  // namespace ballast::train
