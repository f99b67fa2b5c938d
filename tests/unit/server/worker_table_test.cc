#include "server/worker_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ballast::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kLeaseMs = 1000;

v1::RegisterWorkerRequest Registration(int32_t capacity, const std::string& kind = "cpu") {
  v1::RegisterWorkerRequest r;
  r.set_host("127.0.0.1");
  r.set_device_kind(kind);
  r.set_capacity(capacity);
  return r;
}

std::vector<std::string> Ids(const std::vector<WorkerTable::Lapse>& lapsed, bool dies) {
  std::vector<std::string> out;
  for (const WorkerTable::Lapse& l : lapsed) {
    if (dies ? l.dies : l.loses_ranks) out.push_back(l.worker_id);
  }
  return out;
}

TEST(WorkerTableTest, AWorkerDiesOnceItsLeaseHasPassedAndNotAtItsEnd) {
  WorkerTable table(kLeaseMs);
  table.Register("a", Registration(1), 0);
  table.Register("b", Registration(1), 500);
  EXPECT_TRUE(table.Lapsed(kLeaseMs, 0, {}).empty()) << "a's lease ends at 1000, not before";
  EXPECT_EQ(Ids(table.Lapsed(kLeaseMs + 1, 0, {}), true), std::vector<std::string>{"a"});
  // A heartbeat starts the lease over.
  table.Renew(table.Find("a"), 900);
  EXPECT_EQ(Ids(table.Lapsed(kLeaseMs + 501, 0, {}), true), std::vector<std::string>{"b"});
}

TEST(WorkerTableTest, ADeadWorkerLosesItsRanksOnlyAfterTheFence) {
  WorkerTable table(kLeaseMs);
  table.Register("a", Registration(1), 0);
  table.Register("idle", Registration(1), 0);
  const std::set<std::string> with_ranks = {"a"};
  constexpr int64_t kFenceMs = 300;
  // Dying now, with the fence still ahead: marked dead, its ranks kept.
  std::vector<WorkerTable::Lapse> lapsed = table.Lapsed(kLeaseMs + 1, kFenceMs, with_ranks);
  EXPECT_EQ(Ids(lapsed, true), (std::vector<std::string>{"a", "idle"}));
  EXPECT_TRUE(Ids(lapsed, false).empty());
  table.MarkDead(table.Find("a"));
  table.MarkDead(table.Find("idle"));
  EXPECT_TRUE(table.Lapsed(kLeaseMs + kFenceMs, kFenceMs, with_ranks).empty());
  // Past the fence: only the worker with ranks has something to give up.
  lapsed = table.Lapsed(kLeaseMs + kFenceMs + 1, kFenceMs, with_ranks);
  EXPECT_TRUE(Ids(lapsed, true).empty());
  EXPECT_EQ(Ids(lapsed, false), std::vector<std::string>{"a"});
  // Without a fence a worker dies and loses its ranks in one scan.
  WorkerTable unfenced(kLeaseMs);
  unfenced.Register("a", Registration(1), 0);
  lapsed = unfenced.Lapsed(kLeaseMs + 1, 0, with_ranks);
  ASSERT_EQ(lapsed.size(), 1u);
  EXPECT_TRUE(lapsed[0].dies);
  EXPECT_TRUE(lapsed[0].loses_ranks);
}

TEST(WorkerTableTest, ADeadWorkerIsNotLiveAndItsStreamEnds) {
  WorkerTable table(kLeaseMs);
  WorkerEntry& w = table.Register("a", Registration(2), 0);
  w.schedulable = true;
  const std::shared_ptr<Mailbox<v1::Assignment>> stream = w.outbox;
  ASSERT_TRUE(table.Live("a").ok());
  table.MarkDead(&w);
  EXPECT_EQ(table.Live("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(table.Live("a").status().message(), HasSubstr("register again"));
  EXPECT_EQ(table.Live("nobody").status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(w.schedulable);
  std::vector<v1::Assignment> taken;
  EXPECT_EQ(stream->Take(&taken, absl::ZeroDuration()), Mailbox<v1::Assignment>::State::kClosed);
  EXPECT_NE(w.outbox, stream) << "what is sent from now on waits for the next stream";
  EXPECT_EQ(table.alive(), 0);
  // Registering again brings it back, with the same outbox.
  const std::shared_ptr<Mailbox<v1::Assignment>> next = w.outbox;
  table.Register("a", Registration(2), 10);
  EXPECT_TRUE(table.Live("a").ok());
  EXPECT_EQ(table.Find("a")->outbox, next);
  EXPECT_EQ(table.alive(), 1);
}

TEST(WorkerTableTest, LoadedWorkersGetAFreshLease) {
  WorkerTable table(kLeaseMs);
  WorkerRecord r;
  r.worker.set_id("old");
  r.worker.set_alive(true);
  table.Load({r}, 5000);
  EXPECT_TRUE(table.Lapsed(5000 + kLeaseMs, 0, {}).empty());
  EXPECT_EQ(Ids(table.Lapsed(5000 + kLeaseMs + 1, 0, {}), true), std::vector<std::string>{"old"});
}

TEST(WorkerTableTest, TheLargestGangIsTheLiveCapacityOfOneDeviceKind) {
  WorkerTable table(kLeaseMs);
  EXPECT_TRUE(table.CheckGangFits(64, "").ok()) << "no live worker yet: the job waits";
  table.Register("c1", Registration(2, "cuda"), 0);
  table.Register("c2", Registration(2, "cuda"), 0);
  table.Register("p1", Registration(3, "cpu"), 0);
  EXPECT_TRUE(table.CheckGangFits(4, "").ok());
  EXPECT_TRUE(table.CheckGangFits(4, "cuda").ok());
  const absl::Status too_big = table.CheckGangFits(5, "");
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_big.message(), HasSubstr("the largest gang this cluster can place is 4"));
  EXPECT_THAT(too_big.message(), HasSubstr("all of one device kind"));
  EXPECT_FALSE(table.CheckGangFits(4, "cpu").ok());
  // A dead worker's devices do not count.
  table.MarkDead(table.Find("c2"));
  EXPECT_THAT(table.CheckGangFits(3, "cuda").message(),
              HasSubstr("the largest gang this cluster can place is 2 of cuda devices"));
}

TEST(WorkerTableTest, AHybridGangCountsWholeShardGroupsPerWorker) {
  WorkerTable table(kLeaseMs);
  table.Register("a", Registration(3, "cpu"), 0);
  table.Register("b", Registration(3, "cpu"), 0);
  // Six devices, but only one group of 2 (or 3) on each worker.
  EXPECT_TRUE(table.CheckGangFits(6, "cpu", 3).ok());
  EXPECT_TRUE(table.CheckGangFits(4, "cpu", 2).ok());
  const absl::Status split = table.CheckGangFits(6, "cpu", 2);
  EXPECT_EQ(split.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(split.message(), HasSubstr("devices 6 with device cpu in shard groups of "
                                         "sharding.shard_group 2, each on one worker: the "
                                         "largest gang this cluster can place is 4"));
  EXPECT_FALSE(table.CheckGangFits(4, "", 4).ok()) << "no worker holds a group of 4";
}

TEST(WorkerTableTest, RegistrationNamesTheBadField) {
  v1::RegisterWorkerRequest r = Registration(1);
  EXPECT_TRUE(WorkerTable::CheckRegistration(r).ok());
  r.set_capacity(0);
  EXPECT_THAT(WorkerTable::CheckRegistration(r).message(), HasSubstr("capacity"));
  r = Registration(1, "tpu");
  EXPECT_THAT(WorkerTable::CheckRegistration(r).message(), HasSubstr("device_kind"));
  r = Registration(1);
  r.set_previous_worker_id("a b");
  EXPECT_THAT(WorkerTable::CheckRegistration(r).message(), HasSubstr("previous_worker_id"));
}

}  // namespace
}  // namespace ballast::server
