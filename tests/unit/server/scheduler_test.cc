#include "server/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <set>

namespace ballast::server {

// For gtest's messages.
void PrintTo(const Device& d, std::ostream* os) { *os << d.worker_id << " device " << d.device; }

namespace {

// Worker id of every rank, in rank order.
std::vector<std::string> Workers(const Decision& d) {
  std::vector<std::string> out;
  for (const v1::RankPlacement& p : d.ranks) out.push_back(p.worker_id());
  return out;
}

// (worker, device) of every rank, in rank order.
std::vector<Device> Devices(const Decision& d) {
  std::vector<Device> out;
  for (const v1::RankPlacement& p : d.ranks) out.push_back({p.worker_id(), p.device()});
  return out;
}

// Where a lone job of `devices` ranks that avoids `avoid` goes on idle
// workers of the given capacities.
std::vector<Device> PlaceAlone(const std::map<std::string, int32_t>& workers, int32_t devices,
                               std::set<Device> avoid) {
  Scheduler s;
  for (const auto& [id, capacity] : workers) s.AddWorker(id, capacity);
  s.Enqueue("job", 0, 1, devices, "", std::move(avoid));
  const std::vector<Decision> d = s.Schedule();
  return d.size() == 1 ? Devices(d[0]) : std::vector<Device>();
}

std::vector<std::string> Started(const std::vector<Decision>& decisions) {
  std::vector<std::string> out;
  for (const Decision& d : decisions) out.push_back(d.job_id);
  return out;
}

TEST(Scheduler, GangGoesToOneWorkerWithTheFewestFreeThatSuffice) {
  Scheduler s;
  s.AddWorker("big", 8);
  s.AddWorker("small", 4);
  s.Enqueue("job", 0, 1, 3);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"small", "small", "small"}));
  EXPECT_EQ(d[0].ranks[2].rank(), 2);
  EXPECT_EQ(d[0].ranks[2].device(), 2);
  EXPECT_EQ(s.free_devices(), 9);
}

TEST(Scheduler, GangSpreadsOverFewestWorkersWithMostFree) {
  Scheduler s;
  s.AddWorker("a", 2);
  s.AddWorker("b", 3);
  s.AddWorker("c", 1);
  s.Enqueue("job", 0, 1, 4);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  // b (3 free) then a (2 free): two workers, c untouched.
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"b", "b", "b", "a"}));
  EXPECT_EQ(s.free_devices(), 2);
}

TEST(Scheduler, AHybridJobSpreadsInWholeShardGroups) {
  Scheduler s;
  s.AddWorker("a", 3);
  s.AddWorker("b", 3);
  // Without groups it would go b, b, b, a, splitting ranks 2 and 3.
  s.Enqueue("job", 0, 1, 4, "", {}, /*group=*/2);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"b", "b", "a", "a"}));
  EXPECT_EQ(s.free_devices(), 2);
}

TEST(Scheduler, AHybridJobWaitsForWholeGroupsEvenWithEnoughDevicesFree) {
  Scheduler s;
  s.AddWorker("a", 4);
  s.AddWorker("b", 4);
  s.AddWorker("c", 4);
  for (const char* w : {"a", "b", "c"}) ASSERT_TRUE(s.Occupy(w, 0));
  // Nine devices free, three on each worker: no group of 4 fits anywhere.
  s.Enqueue("hybrid", 0, 1, 8, "", {}, /*group=*/4);
  EXPECT_TRUE(s.Schedule().empty());
  s.Release("b", 0);
  EXPECT_TRUE(s.Schedule().empty()) << "one worker with a group of 4 free, two needed";
  s.Release("c", 0);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  const std::vector<std::string> workers = Workers(d[0]);
  for (size_t rank = 0; rank < workers.size(); rank += 4) {
    for (size_t k = rank; k < rank + 4; ++k) EXPECT_EQ(workers[k], workers[rank]) << k;
  }
  EXPECT_NE(workers[0], workers[4]);
}

TEST(Scheduler, AHybridHeadJobReservesWorkersThatCanHoldItsGroups) {
  Scheduler s;
  s.AddWorker("a", 3);
  s.AddWorker("b", 3);
  s.AddWorker("c", 2);
  ASSERT_TRUE(s.Occupy("a", 0));
  ASSERT_TRUE(s.Occupy("b", 0));
  // Needs a and b whole (groups of 3); c cannot hold a group of 3.
  s.Enqueue("head", 0, 1, 6, "", {}, /*group=*/3);
  s.Enqueue("small", 0, 2, 2);
  // The head does not fit; the small job may not take from a or b.
  EXPECT_EQ(Started(s.Schedule()), (std::vector<std::string>{"small"}));
  s.Release("a", 0);
  s.Release("b", 0);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(Started(d), (std::vector<std::string>{"head"}));
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"b", "b", "b", "a", "a", "a"}));
}

TEST(Scheduler, GangWaitsUntilEveryDeviceIsFree) {
  Scheduler s;
  s.AddWorker("a", 4);
  ASSERT_TRUE(s.Occupy("a", 0));
  ASSERT_TRUE(s.Occupy("a", 1));
  s.Enqueue("job", 0, 1, 4);
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_EQ(s.queued(), 1u);
  s.Release("a", 0);
  EXPECT_TRUE(s.Schedule().empty());
  s.Release("a", 1);
  EXPECT_EQ(Started(s.Schedule()), (std::vector<std::string>{"job"}));
  EXPECT_EQ(s.queued(), 0u);
}

TEST(Scheduler, HigherPriorityFirstThenSubmissionOrder) {
  Scheduler s;
  s.Enqueue("low-first", -5, 1, 1);
  s.Enqueue("normal-second", 0, 2, 1);
  s.Enqueue("high-last", 10, 4, 1);
  s.Enqueue("normal-first", 0, 0, 1);
  s.AddWorker("a", 3);
  EXPECT_EQ(Started(s.Schedule()),
            (std::vector<std::string>{"high-last", "normal-first", "normal-second"}));
  EXPECT_EQ(s.queued(), 1u);
}

TEST(Scheduler, BackfillUsesOnlyDevicesOutsideTheHeadReservation) {
  Scheduler s;
  s.AddWorker("a", 4);
  s.AddWorker("b", 2);
  ASSERT_TRUE(s.Occupy("a", 0));
  ASSERT_TRUE(s.Occupy("a", 1));
  ASSERT_TRUE(s.Occupy("b", 0));  // free: a 2, b 1; 3 < 4
  s.Enqueue("head", 0, 1, 4);     // will take all of a
  s.Enqueue("small-1", 0, 2, 1);
  s.Enqueue("small-2", 0, 3, 1);
  const std::vector<Decision> d = s.Schedule();
  // a is reserved for the head: only b's free device is used.
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].job_id, "small-1");
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"b"}));
  s.Release("a", 0);
  EXPECT_TRUE(s.Schedule().empty()) << "small-2 must not take a's freed device";
  s.Release("a", 1);
  const std::vector<Decision> next = s.Schedule();
  ASSERT_EQ(Started(next), (std::vector<std::string>{"head"}));
  EXPECT_EQ(Workers(next[0]), (std::vector<std::string>{"a", "a", "a", "a"}));
}

TEST(Scheduler, LargeHeadJobDoesNotStarveUnderAStreamOfSmallJobs) {
  Scheduler s;
  std::vector<std::pair<std::string, int>> running;
  for (const char* w : {"a", "b", "c"}) {
    s.AddWorker(w, 4);
    for (int dev = 0; dev < 3; ++dev) {
      ASSERT_TRUE(s.Occupy(w, dev));
      running.emplace_back(w, dev);
    }
  }
  // One device free on each worker: 3 < 4, so the head waits, reserves c, and
  // two small jobs backfill a and b.
  s.Enqueue("head", 0, 0, 4);
  int64_t order = 1;
  for (; order <= 3; ++order) s.Enqueue("small-" + std::to_string(order), 0, order, 1);
  EXPECT_EQ(Started(s.Schedule()), (std::vector<std::string>{"small-1", "small-2"}));
  int head_round = -1;
  for (int round = 0; round < 6 && head_round < 0; ++round) {
    // Small jobs keep arriving faster than devices free up.
    for (int i = 0; i < 3; ++i, ++order) s.Enqueue("small-" + std::to_string(order), 0, order, 1);
    s.Release(running.back().first, running.back().second);
    running.pop_back();
    for (const Decision& d : s.Schedule()) {
      if (d.job_id == "head") {
        head_round = round;
        EXPECT_EQ(Workers(d), (std::vector<std::string>{"c", "c", "c", "c"}));
        continue;
      }
      // Small jobs never take the reserved worker's devices.
      EXPECT_NE(d.ranks[0].worker_id(), "c") << d.job_id;
    }
  }
  // c's three busy devices free in rounds 0, 1 and 2.
  EXPECT_EQ(head_round, 2);
}

TEST(Scheduler, JobLargerThanTheClusterReservesNothing) {
  Scheduler s;
  s.AddWorker("a", 2);
  s.Enqueue("huge", 0, 1, 16);
  s.Enqueue("small", 0, 2, 1);
  EXPECT_EQ(Started(s.Schedule()), (std::vector<std::string>{"small"}));
  EXPECT_EQ(s.queued(), 1u);
}

TEST(Scheduler, DeadWorkerOffersNothingAndOccupyFails) {
  Scheduler s;
  s.AddWorker("a", 2);
  s.RemoveWorker("a");
  EXPECT_FALSE(s.Occupy("a", 0));
  s.Enqueue("job", 0, 1, 1);
  EXPECT_TRUE(s.Schedule().empty());
  EXPECT_EQ(s.free_devices(), 0);
  s.AddWorker("a", 2);
  EXPECT_FALSE(s.Occupy("a", 2));  // out of range
  EXPECT_EQ(Started(s.Schedule()), (std::vector<std::string>{"job"}));
}

TEST(Scheduler, AGangNeverMixesDeviceKinds) {
  Scheduler s;
  s.AddWorker("cpu-a", 2, "cpu");
  s.AddWorker("cpu-b", 1, "cpu");
  s.AddWorker("gpu-a", 2, "cuda");
  s.Enqueue("five", 0, 1, 5);   // 3 cpu + 2 cuda are free, but no kind has 5
  s.Enqueue("three", 0, 2, 3);  // only the CPU workers together
  s.Enqueue("two", 0, 3, 2);    // fits gpu-a whole
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(Started(d), (std::vector<std::string>{"three", "two"}));
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"cpu-a", "cpu-a", "cpu-b"}));
  EXPECT_EQ(Workers(d[1]), (std::vector<std::string>{"gpu-a", "gpu-a"}));
  EXPECT_EQ(s.queued(), 1u);
}

TEST(Scheduler, AHeadJobReservesWithinOneKindAndOtherKindsStayUsable) {
  Scheduler s;
  s.AddWorker("cpu-a", 2, "cpu");
  s.AddWorker("cpu-b", 2, "cpu");
  s.AddWorker("gpu-a", 2, "cuda");
  ASSERT_TRUE(s.Occupy("cpu-a", 0));
  s.Enqueue("head", 0, 1, 4);  // waits for cpu-a and cpu-b
  s.Enqueue("small-1", 0, 2, 1);
  s.Enqueue("small-2", 0, 3, 1);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(Started(d), (std::vector<std::string>{"small-1", "small-2"}));
  for (const Decision& small : d) {
    EXPECT_EQ(Workers(small), (std::vector<std::string>{"gpu-a"})) << small.job_id;
  }
  s.Release("cpu-a", 0);
  const std::vector<Decision> next = s.Schedule();
  ASSERT_EQ(Started(next), (std::vector<std::string>{"head"}));
  // Equal free counts: the later id first, as in every spread.
  EXPECT_EQ(Workers(next[0]), (std::vector<std::string>{"cpu-b", "cpu-b", "cpu-a", "cpu-a"}));
}

TEST(Scheduler, AJobThatNamesADeviceKindRunsOnItsWorkersOnly) {
  Scheduler s;
  s.AddWorker("cpu-a", 4, "cpu");
  s.AddWorker("gpu-a", 2, "cuda");
  s.Enqueue("on-gpus", 0, 1, 3, "cuda");  // 4 CPU slots free, but only 2 GPUs
  s.Enqueue("on-cpus", 0, 2, 1, "cpu");   // gpu-a would fit better; it may not go there
  s.Enqueue("anywhere", 0, 3, 2);
  const std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(Started(d), (std::vector<std::string>{"on-cpus", "anywhere"}));
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"cpu-a"}));
  EXPECT_EQ(Workers(d[1]), (std::vector<std::string>{"gpu-a", "gpu-a"}));
  EXPECT_EQ(s.queued(), 1u);

  // The GPU job's reservation holds the GPUs only: a CPU job still starts.
  s.AddWorker("gpu-b", 1, "cuda");
  s.Enqueue("small-cpu", 0, 4, 1, "cpu");
  s.Enqueue("small-gpu", 0, 5, 1, "cuda");
  ASSERT_EQ(Started(s.Schedule()), (std::vector<std::string>{"small-cpu"}));
  s.Release("gpu-a", 0);
  s.Release("gpu-a", 1);
  const std::vector<Decision> next = s.Schedule();
  ASSERT_EQ(Started(next), (std::vector<std::string>{"on-gpus"}));
  EXPECT_EQ(Workers(next[0]), (std::vector<std::string>{"gpu-a", "gpu-a", "gpu-b"}));
}

TEST(Scheduler, BackfillFindsTheFirstJobThatFitsBehindThousandsThatDoNot) {
  Scheduler s;
  s.AddWorker("a", 8);
  s.AddWorker("b", 8);
  for (int dev = 0; dev < 6; ++dev) ASSERT_TRUE(s.Occupy("a", dev));
  for (int dev = 0; dev < 5; ++dev) ASSERT_TRUE(s.Occupy("b", dev));
  // Free: a 2, b 3. The head reserves b (most free), leaving a's 2.
  s.Enqueue("head", 0, 0, 8);
  int64_t order = 1;
  for (; order <= 2000; ++order) s.Enqueue("four-" + std::to_string(order), 0, order, 4);
  s.Enqueue("one-refused", 0, order++, 1);
  s.Enqueue("two", 0, order++, 2);
  s.Enqueue("one", 0, order++, 1);
  std::vector<std::string> asked;
  const std::vector<Decision> d = s.Schedule([&](const std::string& job_id, int32_t) {
    asked.push_back(job_id);
    return job_id != "one-refused";
  });
  EXPECT_EQ(asked, (std::vector<std::string>{"one-refused", "two"}));
  ASSERT_EQ(Started(d), (std::vector<std::string>{"two"}));
  EXPECT_EQ(Workers(d[0]), (std::vector<std::string>{"a", "a"}));
  // The reservation lasts one pass: b's free devices count again.
  EXPECT_EQ(s.free_devices(), 3);
  EXPECT_EQ(s.queued(), 2003u);
}

TEST(Scheduler, DequeueRemovesAQueuedJob) {
  Scheduler s;
  s.Enqueue("job", 0, 1, 1);
  EXPECT_TRUE(s.Dequeue("job"));
  EXPECT_FALSE(s.Dequeue("job"));
  s.AddWorker("a", 1);
  EXPECT_TRUE(s.Schedule().empty());
}

// A job's avoided devices (its stragglers' in earlier attempts) are taken
// after every other free device of the worker it gets.
TEST(Scheduler, AvoidedDevicesAreSkippedWhenTheWorkerHasOthersFree) {
  Scheduler s;
  s.AddWorker("w", 4);
  s.Enqueue("job", 0, 1, 2, "", {{"w", 1}, {"other", 0}});
  std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Devices(d[0]), (std::vector<Device>{{"w", 0}, {"w", 2}}));
  EXPECT_EQ(d[0].ranks[1].rank(), 1);
  EXPECT_EQ(s.free_devices(), 2);

  // Free now: 1, 2 and 3; a job that avoids 0 to 2 takes 3.
  s.Release("w", 2);
  s.Enqueue("next", 0, 2, 1, "", {{"w", 0}, {"w", 1}, {"w", 2}});
  d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Devices(d[0]), (std::vector<Device>{{"w", 3}}));
}

// Avoiding never decides whether a job fits or which worker it gets: an
// avoided device is used when the worker has no other free, last, and the
// job does not wait for a device it would rather have.
TEST(Scheduler, AvoidedDevicesAreUsedWhenNothingElseFits) {
  Scheduler s;
  s.AddWorker("w", 3);
  ASSERT_TRUE(s.Occupy("w", 2));
  s.Enqueue("job", 0, 1, 2, "", {{"w", 0}});
  std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Devices(d[0]), (std::vector<Device>{{"w", 1}, {"w", 0}}));
  EXPECT_EQ(s.free_devices(), 0);

  // Every device of the best-fitting worker avoided: it is still the one.
  EXPECT_EQ(PlaceAlone({{"a", 2}, {"b", 4}}, 2, {{"a", 0}, {"a", 1}}),
            (std::vector<Device>{{"a", 0}, {"a", 1}}));
  // Spread over workers, each takes its avoided devices last.
  EXPECT_EQ(PlaceAlone({{"a", 2}, {"b", 3}}, 5, {{"b", 0}, {"a", 0}}),
            (std::vector<Device>{{"b", 1}, {"b", 2}, {"b", 0}, {"a", 1}, {"a", 0}}));
}

TEST(Scheduler, AJobsAvoidedDevicesAreItsOwn) {
  Scheduler s;
  s.AddWorker("w", 4);
  s.Enqueue("avoids", 0, 1, 1, "", {{"w", 0}});
  s.Enqueue("plain", 0, 2, 1);
  std::vector<Decision> d = s.Schedule();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].job_id, "avoids");
  EXPECT_EQ(Devices(d[0]), (std::vector<Device>{{"w", 1}}));
  EXPECT_EQ(Devices(d[1]), (std::vector<Device>{{"w", 0}}));

  // Enqueued again without them (Enqueue replaces), it avoids nothing.
  s.Release("w", 0);
  s.Release("w", 1);
  s.Enqueue("avoids", 0, 3, 1, "", {{"w", 0}});
  s.Enqueue("avoids", 0, 3, 1);
  d = s.Schedule();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(Devices(d[0]), (std::vector<Device>{{"w", 0}}));
}

}  // namespace
}  // namespace ballast::server
