#include "server/commit_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

StoreBatch NewJob(const std::string& id, int64_t order, const std::string& request_id = "") {
  StoreBatch batch;
  JobRecord& r = batch.jobs.emplace_back().record;
  r.order = order;
  r.job.set_id(id);
  r.job.set_request_id(request_id);
  r.job.set_state(v1::JOB_STATE_QUEUED);
  return batch;
}

class CommitQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = Store::Open(url_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    queue_ = std::make_unique<CommitQueue>(store_.get(), 100, &metrics_);
  }

  std::string Commits() {
    const std::string text = metrics_.Encode();
    const std::string key = "ballast_store_write_seconds_count{op=\"commit\"} ";
    const size_t at = text.find(key);
    return at == std::string::npos
               ? "0"
               : text.substr(at + key.size(), text.find('\n', at) - at - key.size());
  }

  TempDir dir_;
  const std::string url_ = "sqlite:" + (dir_.path() / "b.db").string();
  MetricsRegistry metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<CommitQueue> queue_;
};

TEST_F(CommitQueueTest, BatchesQueuedTogetherAreOneTransactionAndThenRunsInQueueOrder) {
  std::vector<std::string> then;
  auto record = [&](const StoreBatch& written, const absl::Status&) {
    then.push_back(written.jobs[0].record.job.id());
  };
  const CommitQueue::Ticket a = queue_->Queue(NewJob("job-a", 1), record);
  const CommitQueue::Ticket b = queue_->Queue(NewJob("job-b", 2), record);
  const CommitQueue::Ticket c = queue_->Queue(NewJob("job-c", 3), record);
  ASSERT_TRUE(queue_->Wait(c).ok());
  EXPECT_EQ(then, (std::vector<std::string>{"job-a", "job-b", "job-c"}));
  EXPECT_EQ(Commits(), "1");
  // Already written: the earlier tickets return at once.
  EXPECT_TRUE(queue_->Wait(a).ok());
  EXPECT_TRUE(queue_->Wait(b).ok());
  EXPECT_EQ(Commits(), "1");
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 3u);
}

TEST_F(CommitQueueTest, ABadBatchFailsAloneAndTheOthersOfItsTransactionAreStored) {
  ASSERT_TRUE(queue_
                  ->Wait(queue_->Queue(NewJob("job-a", 1, "req-1"),
                                       [](const StoreBatch&, const absl::Status&) {}))
                  .ok());
  int then = 0;
  auto count = [&](const StoreBatch&, const absl::Status&) { ++then; };
  const CommitQueue::Ticket before = queue_->Queue(NewJob("job-b", 2), count);
  const CommitQueue::Ticket bad = queue_->Queue(NewJob("job-c", 3, "req-1"), count);
  const CommitQueue::Ticket after = queue_->Queue(NewJob("job-d", 4), count);
  const absl::Status failed = queue_->Wait(bad);
  EXPECT_EQ(failed.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(failed.message(), HasSubstr("req-1"));
  EXPECT_TRUE(queue_->Wait(before).ok());
  EXPECT_TRUE(queue_->Wait(after).ok());
  EXPECT_EQ(then, 3);
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ((*jobs)[1].job.id(), "job-b");
  EXPECT_EQ((*jobs)[2].job.id(), "job-d");
}

TEST_F(CommitQueueTest, AnEmptyBatchIsNeverWritten) {
  bool ran = false;
  const CommitQueue::Ticket t =
      queue_->Queue(StoreBatch(), [&](const StoreBatch&, const absl::Status&) { ran = true; });
  EXPECT_EQ(t, 0);
  EXPECT_TRUE(queue_->Wait(t).ok());
  EXPECT_FALSE(ran);
  EXPECT_EQ(Commits(), "0");
}

TEST_F(CommitQueueTest, EveryConcurrentCallerFindsItsBatchStoredWhenWaitReturns) {
  constexpr int kCallers = 16;
  constexpr int kBatches = 50;
  std::atomic<int> order{0};
  std::atomic<int> missing{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      // A second connection sees only what was committed.
      auto reader = Store::Open(url_);
      ASSERT_TRUE(reader.ok());
      for (int i = 0; i < kBatches; ++i) {
        const std::string id = "job-" + std::to_string(c) + "-" + std::to_string(i);
        StoreBatch batch = NewJob(id, ++order);
        batch.jobs[0].record.job.set_last_seq(1);
        v1::JobEvent& e = batch.jobs[0].events.emplace_back();
        e.set_job_id(id);
        e.set_seq(1);
        ASSERT_TRUE(queue_
                        ->Wait(queue_->Queue(std::move(batch),
                                             [](const StoreBatch&, const absl::Status&) {}))
                        .ok());
        auto events = (*reader)->ReadEvents(id, 0, 10);
        ASSERT_TRUE(events.ok());
        if (events->size() != 1) ++missing;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(missing.load(), 0);
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), size_t{kCallers * kBatches});
}

}  // namespace
}  // namespace ballast::server
