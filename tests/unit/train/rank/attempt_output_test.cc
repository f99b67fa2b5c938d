#include "worker/train/rank/attempt_output.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>

#include "worker/train/io/file_tree.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::trunc) << text;
}

class AttemptOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "attempt_output_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    out_ = root_ / "job";
    // What two earlier attempts committed.
    Write(out_ / "metrics.jsonl", "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n{\"step\":4}\n");
    Write(out_ / "checkpoints" / "step-00000002" / "state.json", "{\"step\": 2}");
    Write(out_ / "checkpoints" / "step-00000004" / "state.json", "{\"step\": 4}");
  }
  // std::filesystem::remove_all must not be called next to libtorch (file_tree.h).
  void TearDown() override { EXPECT_TRUE(RemoveTree(root_.string()).ok()); }

  std::unique_ptr<AttemptOutput> Claim(int32_t attempt,
                                       std::optional<int64_t> resume_at_or_before = std::nullopt) {
    absl::StatusOr<std::unique_ptr<AttemptOutput>> claimed =
        AttemptOutput::Claim(out_.string(), attempt, resume_at_or_before);
    EXPECT_TRUE(claimed.ok()) << claimed.status();
    return claimed.ok() ? *std::move(claimed) : nullptr;
  }

  fs::path root_;
  fs::path out_;
};

TEST_F(AttemptOutputTest, ClaimSeedsTheAttemptWithTheCommittedMetricsAndNewestCheckpoint) {
  Write(out_ / "attempts" / "1" / "metrics.jsonl", "{\"step\":9}\n");  // a dead attempt's
  std::unique_ptr<AttemptOutput> output = Claim(3);
  ASSERT_NE(output, nullptr);
  const fs::path dir = output->dir();
  EXPECT_EQ(dir, out_ / "attempts" / "3");
  EXPECT_EQ(Read(out_ / "attempt"), "3\n");
  EXPECT_FALSE(fs::exists(out_ / "attempts" / "1")) << "an older attempt's folder stays";
  EXPECT_EQ(Read(dir / "metrics.jsonl"), Read(out_ / "metrics.jsonl"));
  EXPECT_EQ(Read(dir / "checkpoints" / "step-00000004" / "state.json"), "{\"step\": 4}");
  EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-00000002")) << "only the newest is needed";
  // Committed output is untouched by a claim.
  EXPECT_TRUE(fs::exists(out_ / "checkpoints" / "step-00000004"));
}

TEST_F(AttemptOutputTest, RollbackClaimDeletesNewerCommittedCheckpointsAndSeedsTheKeptOne) {
  std::unique_ptr<AttemptOutput> output = Claim(2, /*resume_at_or_before=*/3);
  ASSERT_NE(output, nullptr);
  EXPECT_FALSE(fs::exists(out_ / "checkpoints" / "step-00000004"));
  EXPECT_TRUE(fs::exists(out_ / "checkpoints" / "step-00000002"));
  EXPECT_TRUE(fs::exists(fs::path(output->dir()) / "checkpoints" / "step-00000002"));
}

TEST_F(AttemptOutputTest, RollbackToStepZeroDeletesEveryCommittedCheckpoint) {
  std::unique_ptr<AttemptOutput> output = Claim(2, /*resume_at_or_before=*/0);
  ASSERT_NE(output, nullptr);
  EXPECT_FALSE(fs::exists(out_ / "checkpoints" / "step-00000004"));
  EXPECT_FALSE(fs::exists(out_ / "checkpoints" / "step-00000002"));
  EXPECT_TRUE(fs::is_empty(fs::path(output->dir()) / "checkpoints"));
}

TEST_F(AttemptOutputTest, FirstMetricsCommitReplacesThenOnlyWholeNewLinesAreAppended) {
  std::unique_ptr<AttemptOutput> output = Claim(2);
  ASSERT_NE(output, nullptr);
  const fs::path mine = fs::path(output->dir()) / "metrics.jsonl";
  // The trainer resumed from step 2: it cut lines 3 and 4, then ran step 3.
  Write(mine, "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"again\":true}\n");
  ASSERT_TRUE(output->CommitMetrics().ok());
  EXPECT_EQ(Read(out_ / "metrics.jsonl"), Read(mine));

  std::ofstream(mine, std::ios::app) << "{\"step\":4}\n{\"step\":5";  // line 5 half written
  ASSERT_TRUE(output->CommitMetrics().ok());
  EXPECT_EQ(Read(out_ / "metrics.jsonl"),
            "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"again\":true}\n{\"step\":4}\n");
  std::ofstream(mine, std::ios::app) << "}\n";
  ASSERT_TRUE(output->CommitMetrics().ok());
  EXPECT_THAT(Read(out_ / "metrics.jsonl"), ::testing::EndsWith("{\"step\":4}\n{\"step\":5}\n"));
}

TEST_F(AttemptOutputTest, ALogRewrittenByARollbackIsPublishedWholeAgain) {
  std::unique_ptr<AttemptOutput> output = Claim(2);
  ASSERT_NE(output, nullptr);
  const fs::path mine = fs::path(output->dir()) / "metrics.jsonl";
  Write(mine, "{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"bad\":true}\n");
  ASSERT_TRUE(output->CommitMetrics().ok());
  // The guard went back to step 1: the trainer renamed a shorter log over
  // its own, which then grows past the published length again.
  const fs::path tmp = mine.string() + ".tmp";
  Write(tmp, "{\"step\":1}\n{\"step\":2,\"again\":true}\n{\"step\":3,\"again\":true}\n");
  fs::rename(tmp, mine);
  ASSERT_TRUE(output->CommitMetrics().ok());
  EXPECT_EQ(Read(out_ / "metrics.jsonl"), Read(mine));
}

TEST_F(AttemptOutputTest, TensorBoardCommitsAppendEachFilesNewBytesAndAStaleAttemptsAreRefused) {
  std::unique_ptr<AttemptOutput> old = Claim(2);
  ASSERT_NE(old, nullptr);
  ASSERT_TRUE(old->CommitTensorBoard().ok()) << "no event file yet: nothing to publish";
  EXPECT_FALSE(fs::exists(out_ / "tensorboard"));
  const fs::path first = fs::path(old->dir()) / "tensorboard" / "events.out.tfevents.1.h.10";
  Write(first, "version,start,step1");
  ASSERT_TRUE(old->CommitTensorBoard().ok());
  std::ofstream(first, std::ios::app | std::ios::binary) << std::string("step\0two", 8);
  ASSERT_TRUE(old->CommitTensorBoard().ok());
  ASSERT_TRUE(old->CommitTensorBoard().ok());  // nothing new
  const fs::path published = out_ / "tensorboard" / first.filename();
  EXPECT_EQ(Read(published), "version,start,step1" + std::string("step\0two", 8));

  // The next attempt's process writes a file of its own; the older
  // attempt's published one stays, and nothing of the older attempt is
  // published any more.
  std::unique_ptr<AttemptOutput> current = Claim(3);
  ASSERT_NE(current, nullptr);
  Write(first, "stale");
  EXPECT_EQ(old->CommitTensorBoard().code(), absl::StatusCode::kAborted);
  const fs::path second = fs::path(current->dir()) / "tensorboard" / "events.out.tfevents.2.h.11";
  Write(second, "version,start,step3");
  ASSERT_TRUE(current->CommitTensorBoard().ok());
  EXPECT_EQ(Read(out_ / "tensorboard" / second.filename()), "version,start,step3");
  EXPECT_EQ(Read(published), "version,start,step1" + std::string("step\0two", 8));
}

TEST_F(AttemptOutputTest, CheckpointCommitMovesTheFolderAndReplacesOneOfTheSameStep) {
  std::unique_ptr<AttemptOutput> output = Claim(2);
  ASSERT_NE(output, nullptr);
  const fs::path saved = fs::path(output->dir()) / "checkpoints" / "step-00000004";
  Write(saved / "state.json", "{\"step\": 4, \"new\": true}");
  absl::StatusOr<std::string> committed = output->CommitCheckpoint(saved.string());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(*committed, (out_ / "checkpoints" / "step-00000004").string());
  EXPECT_EQ(Read(fs::path(*committed) / "state.json"), "{\"step\": 4, \"new\": true}");
  EXPECT_FALSE(fs::exists(saved));
  EXPECT_EQ(std::distance(fs::directory_iterator(out_ / "checkpoints"), fs::directory_iterator()),
            2)
      << "only the two checkpoints, no leftover of the replaced one";
}

TEST_F(AttemptOutputTest, ANewerClaimRefusesEveryLaterCommitOfTheOlderAttempt) {
  std::unique_ptr<AttemptOutput> old = Claim(1);
  ASSERT_NE(old, nullptr);
  std::unique_ptr<AttemptOutput> current = Claim(2);
  ASSERT_NE(current, nullptr);
  const std::string committed = Read(out_ / "metrics.jsonl");

  Write(fs::path(old->dir()) / "metrics.jsonl", "{\"step\":5,\"stale\":true}\n");
  const absl::Status metrics = old->CommitMetrics();
  EXPECT_EQ(metrics.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(metrics.message(), HasSubstr("attempt 2"));
  EXPECT_EQ(Read(out_ / "metrics.jsonl"), committed);

  const fs::path saved = fs::path(old->dir()) / "checkpoints" / "step-00000006";
  Write(saved / "state.json", "{}");
  EXPECT_EQ(old->CommitCheckpoint(saved.string()).status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(fs::exists(out_ / "checkpoints" / "step-00000006"));

  Write(fs::path(old->dir()) / "adapter" / "adapter_config.json", "{}");
  EXPECT_EQ(old->CommitExport().status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(fs::exists(out_ / "adapter"));

  // An attempt older than the holder cannot claim the folder back.
  EXPECT_EQ(AttemptOutput::Claim(out_.string(), 1, 0).status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(current->CommitMetrics().ok());
}

TEST_F(AttemptOutputTest, ExportCommitReplacesTheOldExportAndRemovesTheAttemptFolder) {
  Write(out_ / "adapter" / "adapter_config.json", "old");
  std::unique_ptr<AttemptOutput> output = Claim(2);
  ASSERT_NE(output, nullptr);
  Write(fs::path(output->dir()) / "adapter" / "adapter_config.json", "new");
  absl::StatusOr<std::string> exported = output->CommitExport();
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(*exported, (out_ / "adapter").string());
  EXPECT_EQ(Read(out_ / "adapter" / "adapter_config.json"), "new");
  EXPECT_FALSE(fs::exists(output->dir()));
  EXPECT_FALSE(fs::exists(out_ / ".adapter.old.tmp"));
}

}  // namespace
}  // namespace ballast::train
