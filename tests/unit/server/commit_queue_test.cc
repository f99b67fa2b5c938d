#include "server/commit_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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
  // The writer is held in job-0's callback (it runs on the writer, outside
  // the queue's lock) while a, b and c are queued, so that they wait
  // together however soon the writer would otherwise take job-a alone (the
  // full suite under load failed that way once).
  absl::Notification holding, queued;
  queue_->Queue(NewJob("job-0", 1), [&](const StoreBatch&, const absl::Status&) {
    holding.Notify();
    queued.WaitForNotification();
  });
  holding.WaitForNotification();
  const CommitQueue::Ticket a = queue_->Queue(NewJob("job-a", 2), record);
  const CommitQueue::Ticket b = queue_->Queue(NewJob("job-b", 3), record);
  const CommitQueue::Ticket c = queue_->Queue(NewJob("job-c", 4), record);
  queued.Notify();
  ASSERT_TRUE(queue_->Wait(c).ok());
  EXPECT_EQ(then, (std::vector<std::string>{"job-a", "job-b", "job-c"}));
  EXPECT_EQ(Commits(), "2");  // job-0's, then a, b and c's
  // Already written: the earlier tickets return at once.
  EXPECT_TRUE(queue_->Wait(a).ok());
  EXPECT_TRUE(queue_->Wait(b).ok());
  EXPECT_EQ(Commits(), "2");
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 4u);
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

TEST_F(CommitQueueTest, WhenWrittenCallsBackFromTheWriterOnceStoredWithEachBatchsOwnOutcome) {
  ASSERT_TRUE(queue_
                  ->Wait(queue_->Queue(NewJob("job-a", 1, "req-1"),
                                       [](const StoreBatch&, const absl::Status&) {}))
                  .ok());
  absl::Mutex mu;
  std::vector<std::pair<std::string, absl::Status>> outcomes;
  std::vector<std::thread::id> threads;
  std::string then_order;
  auto callback = [&](const std::string& id) {
    return [&, id](const absl::Status& status) {
      // Stored by now: another connection finds the job (or not, on an error).
      auto reader = Store::Open(url_);
      ASSERT_TRUE(reader.ok());
      auto found = (*reader)->ReadJob(id);
      ASSERT_TRUE(found.ok());
      absl::MutexLock lock(&mu);
      EXPECT_EQ(found->has_value(), status.ok()) << id;
      outcomes.emplace_back(id, status);
      threads.push_back(std::this_thread::get_id());
    };
  };
  auto then = [&](const StoreBatch& written, const absl::Status&) {
    absl::MutexLock lock(&mu);
    then_order += written.jobs[0].record.job.id().back();
  };
  // The writer is held in the `then` of a batch before them, so the
  // callbacks below are surely registered before their batches are written.
  absl::Notification registered;
  queue_->Queue(NewJob("job-gate", 2),
                [&](const StoreBatch&, const absl::Status&) { registered.WaitForNotification(); });
  const CommitQueue::Ticket b = queue_->Queue(NewJob("job-b", 3), then);
  // A request_id already stored: this batch alone fails.
  const CommitQueue::Ticket bad = queue_->Queue(NewJob("job-c", 4, "req-1"), then);
  queue_->WhenWritten(b, callback("job-b"));
  queue_->WhenWritten(bad, callback("job-c"));
  registered.Notify();
  // Wait and WhenWritten mix.
  const CommitQueue::Ticket d = queue_->Queue(NewJob("job-d", 5), then);
  EXPECT_TRUE(queue_->Wait(d).ok());
  {
    absl::MutexLock lock(&mu);
    mu.Await(absl::Condition(
        +[](decltype(outcomes)* o) { return o->size() == 2; }, &outcomes));
    EXPECT_EQ(then_order, "bcd");
    ASSERT_EQ(outcomes.size(), 2u);
    EXPECT_EQ(outcomes[0].first, "job-b");
    EXPECT_TRUE(outcomes[0].second.ok());
    EXPECT_EQ(outcomes[1].first, "job-c");
    EXPECT_EQ(outcomes[1].second.code(), absl::StatusCode::kAlreadyExists);
    for (const std::thread::id& t : threads) EXPECT_NE(t, std::this_thread::get_id());
  }
  // Written already: the callback runs at once, on the caller's thread, and
  // a failure is still told (once).
  absl::Status late;
  bool ran = false;
  queue_->WhenWritten(b, [&](const absl::Status& s) { ran = s.ok(); });
  EXPECT_TRUE(ran);
  queue_->WhenWritten(0, [&](const absl::Status& s) { late = s; });
  EXPECT_TRUE(late.ok());
}

TEST_F(CommitQueueTest, AQueueDestroyedWithBatchesQueuedWritesThemFirst) {
  std::vector<absl::Status> outcomes;
  for (int i = 0; i < 20; ++i) {
    const CommitQueue::Ticket t = queue_->Queue(NewJob("job-" + std::to_string(i), i + 1),
                                                [](const StoreBatch&, const absl::Status&) {});
    queue_->WhenWritten(t, [&](const absl::Status& s) { outcomes.push_back(s); });
  }
  queue_.reset();
  // The writer thread has been joined: its callbacks are all visible here.
  EXPECT_EQ(outcomes.size(), 20u);
  for (const absl::Status& s : outcomes) EXPECT_TRUE(s.ok()) << s;
  auto jobs = store_->LoadJobs();
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 20u);
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
