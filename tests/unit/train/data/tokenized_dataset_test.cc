#include "worker/train/data/tokenized_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> Values(const at::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

class TokenizedDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "dataset_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove(path()), fs::remove(dir_); }

  std::string path() const { return (fs::path(dir_) / "data.jsonl").string(); }
  void Write(const std::string& text) { std::ofstream(path()) << text; }

  // The tokens file at path() in `order`, with a vocabulary of 64.
  TokenizedDataset Open(DataOrder order) {
    absl::StatusOr<DocumentEncoder> encoder = DocumentEncoder::Create(
        {.format = DataFormat::kTokens, .vocab_size = 64}, std::nullopt, std::nullopt);
    EXPECT_TRUE(encoder.ok()) << encoder.status();
    absl::StatusOr<TokenCache> cache = TokenCache::BuildInMemory(
        *encoder, {.data_path = path(), .seq_len = order.seq_len, .max_line_bytes = 1 << 20});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return TokenizedDataset(*std::move(cache), order);
  }

  std::string dir_;
};

TEST_F(TokenizedDatasetTest, PacksDocumentsWithBoundariesPositionsAndNextTokenTargets) {
  Write(
      "{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7]}\n"
      "\n"
      "{\"input_ids\": [8, 9]}\n");
  absl::StatusOr<TokenizedDataset> ds = TokenizedDataset::Load(path(), 16, 8);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->rows_per_epoch(), 2);

  PackedBatch b = ds->Pack(0, 2);
  EXPECT_THAT(Values(b.input_ids), ElementsAre(5, 6, 7, 8, 9));
  EXPECT_THAT(Values(b.position_ids), ElementsAre(0, 1, 2, 0, 1));
  EXPECT_THAT(Values(b.cu_seqlens), ElementsAre(0, 3, 5));
  // Position t predicts labels[t + 1] of its own document; a document's last
  // position predicts nothing, so no target crosses a boundary.
  EXPECT_THAT(Values(b.targets), ElementsAre(6, 7, -100, 9, -100));
  EXPECT_EQ(b.supervised_tokens, 3);
  // The documents' lines in the file, from 0 (line 1 is blank).
  EXPECT_THAT(b.document_ids, ElementsAre(0, 2));
  EXPECT_EQ(b.mask.kind, kernels::MaskKind::kCausal);
  EXPECT_FALSE(b.loss_weights.defined());
  EXPECT_FALSE(b.group_offsets.defined());
}

TEST_F(TokenizedDatasetTest, WrapsAroundEpochsWithAFreshPermutationEach) {
  std::string text;
  for (int i = 0; i < 64; ++i) text += "{\"input_ids\": [" + std::to_string(i) + ", 1]}\n";
  Write(text);
  TokenizedDataset ds = Open({.seq_len = 4, .shuffle = true, .seed = 7});
  ASSERT_EQ(ds.rows_per_epoch(), 64);

  std::vector<int64_t> epoch0, epoch1;
  for (int64_t c = 0; c < 64; ++c) epoch0.push_back(ds.RowDocuments(c)[0]);
  for (int64_t c = 64; c < 128; ++c) epoch1.push_back(ds.RowDocuments(c)[0]);
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 64u);
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), 64u);
  EXPECT_NE(epoch0, epoch1);
  // The order is a function of (seed, cursor) alone: asking out of order, as
  // a resume does, gives the same documents.
  EXPECT_EQ(ds.RowDocuments(5)[0], epoch0[5]);
  EXPECT_EQ(ds.RowDocuments(64 + 9)[0], epoch1[9]);
  EXPECT_EQ(Open({.seq_len = 4, .shuffle = false}).RowDocuments(70)[0], 6);

  PackedBatch b = ds.Pack(62, 4);
  EXPECT_THAT(b.document_ids, ElementsAre(epoch0[62], epoch0[63], epoch1[0], epoch1[1]));
}

TEST_F(TokenizedDatasetTest, PackedRowsHoldWholeDocumentsAndAreTheSameCountEveryEpoch) {
  // 200 documents of 2..40 tokens into rows of 64.
  std::mt19937 rng(std::random_device{}());
  std::string text;
  int64_t total = 0;
  for (int d = 0; d < 200; ++d) {
    const int n = std::uniform_int_distribution<int>(2, 40)(rng);
    total += n;
    text += "{\"input_ids\": [" + std::to_string(d % 16);
    for (int t = 1; t < n; ++t) text += ", " + std::to_string(t % 16);
    text += "]}\n";
  }
  Write(text);
  TokenizedDataset ds = Open({.seq_len = 64, .packing = true, .shuffle = true, .seed = 3});
  const int64_t rows = ds.rows_per_epoch();
  EXPECT_GE(rows, (total + 63) / 64);
  EXPECT_LT(rows, 200);
  EXPECT_NEAR(ds.packing().efficiency, static_cast<double>(total) / (rows * 64), 1e-12);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::multiset<int64_t> seen;
    for (int64_t r = epoch * rows; r < (epoch + 1) * rows; ++r) {
      const PackedBatch b = ds.Pack(r, 1);
      const std::vector<int64_t> cu = Values(b.cu_seqlens);
      EXPECT_LE(cu.back(), 64);
      for (const int64_t d : ds.RowDocuments(r)) seen.insert(d);
      // Each document restarts its positions, and its last position has no
      // target: nothing crosses a boundary.
      const std::vector<int64_t> positions = Values(b.position_ids);
      const std::vector<int64_t> targets = Values(b.targets);
      for (size_t k = 0; k + 1 < cu.size(); ++k) {
        EXPECT_EQ(positions[cu[k]], 0);
        EXPECT_EQ(targets[cu[k + 1] - 1], -100);
      }
    }
    // Every document exactly once per epoch.
    EXPECT_EQ(seen.size(), 200u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 200u);
  }
  EXPECT_NE(ds.DocumentLines(0, rows), ds.DocumentLines(rows, rows));
}

TEST_F(TokenizedDatasetTest, RefusesBadLinesNamingFileAndLine) {
  struct Case {
    const char* line;
    const char* message;
  };
  for (const Case& c : {
           Case{"not json", ":1: not a JSON object"},
           Case{"{\"labels\": [1, 2]}", ":1: input_ids must be a list"},
           Case{"{\"input_ids\": [1, 99]}", "token id 99 outside the vocabulary [0, 16)"},
           Case{"{\"input_ids\": [1, 2], \"labels\": [1]}", "labels has 1 entries, input_ids 2"},
           Case{"{\"input_ids\": [1, 2], \"labels\": [1, -5]}", "label -5 is neither -100"},
           Case{"{\"input_ids\": [1]}", "at least 2 tokens"},
           Case{"{\"input_ids\": [1, 2, 3, 4, 5]}", "5 tokens, more than data.seq_len = 4"},
       }) {
    Write(c.line);
    absl::StatusOr<TokenizedDataset> ds = TokenizedDataset::Load(path(), 16, 4);
    ASSERT_FALSE(ds.ok()) << c.line;
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(ds.status().message(), HasSubstr(c.message)) << c.line;
  }
  Write("\n\n");
  EXPECT_THAT(TokenizedDataset::Load(path(), 16, 4).status().message(),
              HasSubstr("no documents to train on (0 records"));
  // A line far longer than seq_len allows (once: 200 MB, std::bad_alloc) is
  // refused by its length, before it is read whole.
  Write("{\"input_ids\": [1, 2]}\n{\"input_ids\": [" + std::string(1 << 22, '1') + "]}\n");
  absl::Status long_line = TokenizedDataset::Load(path(), 16, 4).status();
  EXPECT_EQ(long_line.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_line.message(), HasSubstr("data.jsonl:2: the line is longer than"));
  EXPECT_EQ(TokenizedDataset::Load(path() + ".missing", 16, 4).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ballast::train
