#include "server/job_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ballast::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

constexpr int64_t kRetentionMs = 1000;

TEST(JobHistoryTest, TheOldestFinishedJobIsEvictedFirstBeyondTheKeptNumber) {
  JobHistory history(/*kept=*/2, kRetentionMs);
  history.Finished("a", 10);
  history.Finished("b", 20);
  EXPECT_THAT(history.TakeToEvict(), IsEmpty());
  history.Finished("c", 30);
  history.Finished("d", 40);
  EXPECT_THAT(history.TakeToEvict(), ElementsAre("a", "b"));
  EXPECT_THAT(history.Shown(40), ElementsAre("c", "d"));
}

TEST(JobHistoryTest, LoadedJobsKeepTheNewestByFinishTime) {
  JobHistory history(/*kept=*/2, kRetentionMs);
  history.Load({{"late", 300}, {"early", 100}, {"middle", 200}}, {{v1::JOB_STATE_FAILED, 4}});
  EXPECT_THAT(history.TakeToEvict(), ElementsAre("early"));
  EXPECT_THAT(history.Shown(300), ElementsAre("middle", "late"));
  EXPECT_THAT(history.EvictedByState(), ElementsAre(Pair(v1::JOB_STATE_FAILED, 4)));
}

TEST(JobHistoryTest, JobsLeaveOnlyOnceTheRetentionHasPassed) {
  JobHistory history(/*kept=*/10, kRetentionMs);
  history.Finished("a", 0);
  history.Finished("b", 500);
  // At exactly the retention a job still shows.
  EXPECT_FALSE(history.Expire(kRetentionMs));
  EXPECT_THAT(history.Shown(kRetentionMs + 1), ElementsAre("b"));
  EXPECT_THAT(history.TakeToEvict(), IsEmpty()) << "Shown evicts nothing";
  EXPECT_TRUE(history.Expire(kRetentionMs + 1));
  EXPECT_THAT(history.TakeToEvict(), ElementsAre("a"));
  EXPECT_FALSE(history.Expire(kRetentionMs + 1));
  EXPECT_TRUE(history.Expire(kRetentionMs + 501));
  EXPECT_THAT(history.TakeToEvict(), ElementsAre("b"));
  EXPECT_THAT(history.Shown(kRetentionMs + 501), IsEmpty());
}

TEST(JobHistoryTest, StoredEvictionsAreTakenOnceAndInOrder) {
  JobHistory history(/*kept=*/1, kRetentionMs);
  EXPECT_FALSE(history.HasStoredEvictions());
  history.EvictionStored("a", true);
  history.EvictionStored("b", false);
  EXPECT_TRUE(history.HasStoredEvictions());
  EXPECT_THAT(history.TakeStoredEvictions(), ElementsAre(Pair("a", true), Pair("b", false)));
  EXPECT_FALSE(history.HasStoredEvictions());
  // A job put back is evicted again, after those already waiting.
  history.Finished("c", 0);
  history.Finished("d", 0);
  history.EvictLater("b");
  EXPECT_THAT(history.TakeToEvict(), ElementsAre("c", "b"));
  history.Evicted(v1::JOB_STATE_CANCELLED);
  history.Evicted(v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(history.EvictedByState(), ElementsAre(Pair(v1::JOB_STATE_CANCELLED, 2)));
}

}  // namespace
}  // namespace ballast::server
