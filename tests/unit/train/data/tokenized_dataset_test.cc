#include "worker/train/data/tokenized_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

  std::string dir_;
};

TEST_F(TokenizedDatasetTest, PacksDocumentsWithBoundariesPositionsAndNextTokenTargets) {
  Write(
      "{\"input_ids\": [5, 6, 7], \"labels\": [-100, 6, 7]}\n"
      "\n"
      "{\"input_ids\": [8, 9]}\n");
  absl::StatusOr<TokenizedDataset> ds = TokenizedDataset::Load(path(), 16, 8);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ(ds->size(), 2);

  PackedBatch b = ds->Pack(0, 2, /*shuffle=*/false, /*seed=*/0);
  EXPECT_THAT(Values(b.input_ids), ElementsAre(5, 6, 7, 8, 9));
  EXPECT_THAT(Values(b.position_ids), ElementsAre(0, 1, 2, 0, 1));
  EXPECT_THAT(Values(b.cu_seqlens), ElementsAre(0, 3, 5));
  // Position t predicts labels[t + 1] of its own document; a document's last
  // position predicts nothing, so no target crosses a boundary.
  EXPECT_THAT(Values(b.targets), ElementsAre(6, 7, -100, 9, -100));
  EXPECT_EQ(b.supervised_tokens, 3);
  EXPECT_THAT(b.document_ids, ElementsAre(0, 1));
  EXPECT_EQ(b.mask.kind, kernels::MaskKind::kCausal);
  EXPECT_FALSE(b.loss_weights.defined());
  EXPECT_FALSE(b.group_offsets.defined());
}

TEST_F(TokenizedDatasetTest, WrapsAroundEpochsWithAFreshPermutationEach) {
  std::string text;
  for (int i = 0; i < 64; ++i) text += "{\"input_ids\": [" + std::to_string(i) + ", 1]}\n";
  Write(text);
  absl::StatusOr<TokenizedDataset> ds = TokenizedDataset::Load(path(), 64, 4);
  ASSERT_TRUE(ds.ok()) << ds.status();

  std::vector<int64_t> epoch0, epoch1;
  for (int64_t c = 0; c < 64; ++c) epoch0.push_back(ds->IndexAt(c, /*shuffle=*/true, 7));
  for (int64_t c = 64; c < 128; ++c) epoch1.push_back(ds->IndexAt(c, /*shuffle=*/true, 7));
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()).size(), 64u);
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()).size(), 64u);
  EXPECT_NE(epoch0, epoch1);
  // The order is a function of (seed, cursor) alone: asking out of order, as
  // a resume does, gives the same documents.
  EXPECT_EQ(ds->IndexAt(5, true, 7), epoch0[5]);
  EXPECT_EQ(ds->IndexAt(64 + 9, true, 7), epoch1[9]);
  EXPECT_EQ(ds->IndexAt(70, /*shuffle=*/false, 7), 6);

  PackedBatch b = ds->Pack(62, 4, /*shuffle=*/true, 7);
  EXPECT_THAT(b.document_ids, ElementsAre(epoch0[62], epoch0[63], epoch1[0], epoch1[1]));
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
  EXPECT_THAT(TokenizedDataset::Load(path(), 16, 4).status().message(), HasSubstr("no examples"));
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
