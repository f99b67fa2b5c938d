#include "server/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/rank_event_bound.h"
#include "tests/unit/server/test_util.h"

namespace ballast::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::TempDir;
using testing::ValidSpec;

constexpr int64_t kLeaseMs = 1000;

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(); }

  CoordinatorOptions Options() {
    CoordinatorOptions o;
    o.output_root = (dir_.path() / "jobs").string();
    o.lease_ms = kLeaseMs;
    o.event_retention = retention_;
    o.stop_grace_ms = 5;
    o.agent_silence_ms = agent_silence_ms_;
    o.path_roots = path_roots_;
    o.now_ms = [this] { return now_.load(); };
    o.list_page_bytes = list_page_bytes_;
    o.finished_jobs_kept = finished_jobs_kept_;
    o.job_history = job_history_;
    return o;
  }

  void Open() {
    auto store = Store::Open("sqlite:" + (dir_.path() / "ballastd.db").string());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    // A restarted ballastd starts with an empty registry, and the registry
    // keeps the collector of every coordinator it was given.
    metrics_ = std::make_unique<MetricsRegistry>();
    auto c = Coordinator::Create(store_.get(), metrics_.get(), Options());
    ASSERT_TRUE(c.ok()) << c.status();
    c_ = std::move(*c);
  }

  // A coordinator restart over the same database.
  void Reopen() {
    feeds_.clear();
    c_.reset();
    store_.reset();
    Open();
  }

  v1::Job Submit(int32_t max_restarts = 3, const std::string& request_id = "") {
    v1::JobSpec spec = ValidSpec(dir_.path());
    spec.mutable_scheduling()->set_max_restarts(max_restarts);
    auto job = c_->SubmitJob(spec, request_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  // `n` jobs, submitted with request_ids req-0, req-1, ... and cancelled.
  std::vector<v1::Job> SubmitCancelled(int n) {
    std::vector<v1::Job> done;
    for (int i = 0; i < n; ++i) {
      done.push_back(Submit(3, absl::StrCat("req-", i)));
      EXPECT_TRUE(c_->CancelJob(done.back().id()).ok());
    }
    return done;
  }

  // A job of `devices` ranks.
  v1::Job SubmitGang(int32_t devices, int32_t max_restarts = 3) {
    v1::JobSpec spec = ValidSpec(dir_.path());
    spec.set_devices(devices);
    spec.mutable_data()->set_grad_accum_steps(devices);  // one micro-batch per rank
    spec.mutable_scheduling()->set_max_restarts(max_restarts);
    auto job = c_->SubmitJob(spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }

  std::string Register(const std::string& host, int capacity,
                       const std::vector<v1::RankRef>& running = {},
                       const std::string& previous = "", const std::string& kind = "cpu") {
    v1::RegisterWorkerRequest r;
    r.set_host(host);
    r.set_device_kind(kind);
    r.set_capacity(capacity);
    r.set_previous_worker_id(previous);
    for (const v1::RankRef& ref : running) *r.add_running() = ref;
    auto response = c_->RegisterWorker(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? response->worker_id() : "";
  }

  // Every assignment sent to the worker so far, through its stream.
  std::vector<v1::Assignment> Drain(const std::string& worker_id) {
    std::vector<v1::Assignment> out;
    for (int tries = 0; tries < 2; ++tries) {
      auto& feed = feeds_[worker_id];
      if (feed == nullptr) {
        auto f = c_->StreamAssignments(worker_id);
        if (!f.ok()) return out;
        feed = std::move(*f);
      }
      if (feed->Next(&out, absl::ZeroDuration())) return out;
      feed.reset();  // replaced or closed: open a new stream once
    }
    return out;
  }

  absl::Status Report(const std::string& worker_id, std::vector<v1::RankEvent> events) {
    v1::ReportEventsRequest r;
    r.set_worker_id(worker_id);
    r.set_report_id(++report_ids_[worker_id]);
    for (v1::RankEvent& e : events) *r.add_events() = std::move(e);
    return c_->ReportEvents(r).status();
  }

  static v1::RankEvent Event(const v1::Assignment& a) {
    v1::RankEvent e;
    e.set_job_id(a.job_id());
    e.set_attempt(a.attempt());
    e.set_rank(a.rank());
    return e;
  }
  static v1::RankEvent Started(const v1::Assignment& a) {
    v1::RankEvent e = Event(a);
    e.mutable_started()->set_pid(1234);
    return e;
  }
  static v1::RankEvent Exited(const v1::Assignment& a, int code, const std::string& tail = "") {
    v1::RankEvent e = Event(a);
    e.mutable_exited()->set_exit_code(code);
    e.mutable_exited()->set_stderr_tail(tail);
    return e;
  }
  // A step of rank a.rank() with loss 2.5 and grad_norm 0.75.
  static v1::RankEvent Step(const v1::Assignment& a, int64_t step) {
    v1::RankEvent e = StepWithoutLoss(a, step);
    e.mutable_training()->mutable_step_metrics()->set_loss(2.5);
    return e;
  }
  // A step without supervised tokens: no loss.
  static v1::RankEvent StepWithoutLoss(const v1::Assignment& a, int64_t step) {
    v1::RankEvent e = Event(a);
    v1::StepMetrics* m = e.mutable_training()->mutable_step_metrics();
    m->set_step(step);
    m->set_grad_norm(0.75);
    return e;
  }

  // Rank 0's StragglerWatch report, sent by `r0`, that `rank` became (or
  // stopped being) a straggler.
  static v1::RankEvent Straggler(const v1::Assignment& r0, int32_t rank, bool straggling) {
    v1::RankEvent e = Event(r0);
    v1::StragglerReport* s = e.mutable_training()->mutable_straggler();
    s->set_rank(rank);
    s->set_step(3);
    s->set_step_time_s(2.0);
    s->set_others_step_time_s(0.5);
    s->set_straggling(straggling);
    return e;
  }

  v1::Job Get(const std::string& id) { return *c_->GetJob(id); }

  void Heartbeat(const std::string& worker_id) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(worker_id);
    EXPECT_TRUE(c_->Heartbeat(hb).ok()) << worker_id;
  }

  static v1::RankRef Ref(const v1::Assignment& a) {
    v1::RankRef ref;
    ref.set_job_id(a.job_id());
    ref.set_attempt(a.attempt());
    ref.set_rank(a.rank());
    return ref;
  }

  // A gang of two ranks started on one worker with two devices.
  struct TwoRanks {
    std::string worker;
    v1::Job job;
    v1::Assignment r0, r1;
  };
  TwoRanks StartTwoRanks() {
    TwoRanks g;
    g.worker = Register("node-1", 2);
    g.job = SubmitGang(2);
    const auto starts = GangStarts({g.worker}, g.job.id());
    if (starts.size() != 2u) {
      ADD_FAILURE() << "expected both ranks on " << g.worker;
      return TwoRanks();
    }
    g.r0 = starts.at(0).second;
    g.r1 = starts.at(1).second;
    return g;
  }

  // The STARTs of `job_id` sent to `workers` so far, by rank.
  std::map<int32_t, std::pair<std::string, v1::Assignment>> GangStarts(
      const std::vector<std::string>& workers, const std::string& job_id) {
    std::map<int32_t, std::pair<std::string, v1::Assignment>> out;
    for (const std::string& w : workers) {
      for (const v1::Assignment& a : Drain(w)) {
        if (a.action() == v1::Assignment::ACTION_START && a.job_id() == job_id) {
          EXPECT_TRUE(out.emplace(a.rank(), std::make_pair(w, a)).second) << "rank " << a.rank();
        }
      }
    }
    return out;
  }

  // The only START for `job_id` among `assignments`.
  static v1::Assignment StartOf(const std::vector<v1::Assignment>& assignments,
                                const std::string& job_id) {
    for (const v1::Assignment& a : assignments) {
      if (a.action() == v1::Assignment::ACTION_START && a.job_id() == job_id) return a;
    }
    ADD_FAILURE() << "no start assignment for " << job_id;
    return v1::Assignment();
  }

  // Every event of the job, from the start of retention.
  std::vector<v1::JobEvent> Events(const std::string& id) {
    auto watch = c_->WatchJob(id, 0);
    EXPECT_TRUE(watch.ok());
    std::vector<v1::JobEvent> out;
    (*watch)->Next(&out, absl::ZeroDuration()).IgnoreError();
    return out;
  }

  TempDir dir_;
  std::atomic<int64_t> now_{1'700'000'000'000};
  int64_t retention_ = 10000;
  int64_t agent_silence_ms_ = 0;
  std::vector<std::string> path_roots_;
  size_t list_page_bytes_ = size_t{2} << 20;
  size_t finished_jobs_kept_ = 1000;
  int64_t job_history_ = 0;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Coordinator> c_;
  std::map<std::string, std::unique_ptr<AssignmentFeed>> feeds_;
  std::map<std::string, int64_t> report_ids_;
};

TEST_F(CoordinatorTest, SubmittedJobIsScheduledWithRendezvousAndOutputDir) {
  const std::string w = Register("node-1", 2);
  const v1::Job job = Submit();
  EXPECT_THAT(job.id(), ::testing::MatchesRegex("job-[0-9a-f]{12}"));
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(job.output_dir(), (dir_.path() / "jobs" / job.id()).string());
  const v1::Assignment a = StartOf(Drain(w), job.id());
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.world_size(), 1);
  EXPECT_EQ(a.master_addr(), "node-1");
  EXPECT_GE(a.master_port(), 29500);
  EXPECT_EQ(a.spec().lora().r(), 8) << "defaults are applied before the spec goes out";
  EXPECT_EQ(a.output_dir(), job.output_dir());
}

TEST_F(CoordinatorTest, SameRequestIdReturnsTheFirstJob) {
  const v1::Job first = Submit(3, "req-1");
  now_ += 5;
  const v1::Job again = Submit(3, "req-1");
  const v1::Job other = Submit(3, "req-2");
  EXPECT_EQ(first.id(), again.id());
  // Unchanged: the retry only waits for the first job to be stored.
  EXPECT_EQ(again.updated_ms(), first.updated_ms());
  EXPECT_EQ(again.last_seq(), first.last_seq());
  EXPECT_NE(first.id(), other.id());
  auto list = c_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->jobs_size(), 2);
}

TEST_F(CoordinatorTest, InvalidSpecIsRejectedNamingTheField) {
  v1::JobSpec spec = ValidSpec(dir_.path());
  spec.mutable_lora()->set_r(0);
  auto bad_r = c_->SubmitJob(spec, "");
  EXPECT_EQ(bad_r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_r.status().message(), HasSubstr("lora.r"));

  spec = ValidSpec(dir_.path());
  spec.mutable_data()->set_seq_len(4096);
  auto long_seq = c_->SubmitJob(spec, "");
  EXPECT_EQ(long_seq.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_seq.status().message(), HasSubstr("data.seq_len"));
  EXPECT_THAT(long_seq.status().message(), HasSubstr("1..2048"));

  spec = ValidSpec(dir_.path());
  spec.mutable_data()->set_path((dir_.path() / "missing.jsonl").string());
  auto missing = c_->SubmitJob(spec, "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.status().message(), HasSubstr("data.path"));
  EXPECT_EQ(c_->ListJobs(v1::ListJobsRequest())->jobs_size(), 0);
}

TEST_F(CoordinatorTest, UnknownJobIsNotFound) {
  EXPECT_EQ(c_->GetJob("job-000000000000").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->CancelJob("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->RollbackJob("nope", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c_->WatchJob("nope", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, FirstRankEventRunsAndExitZeroSucceeds) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a)}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Report(w, {Step(a, 7), Exited(a, 0)}).ok());
  const v1::Job done = Get(job.id());
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.step(), 7);
  EXPECT_EQ(done.placement_size(), 0);
  const std::vector<v1::JobEvent> events = Events(job.id());
  ASSERT_FALSE(events.empty());
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].seq(), int64_t(i + 1));
  EXPECT_EQ(events.back().state_change().to(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, ExitCodeTwoFailsAtOnceWithoutRestart) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit(3);
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Exited(a, 2, "loading\nbad data: row 3\n")}).ok());
  const v1::Job failed = Get(job.id());
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(failed.restarts(), 0);
  EXPECT_THAT(failed.failure_reason(), HasSubstr("exited with code 2: bad data: row 3"));
}

TEST_F(CoordinatorTest, FailuresRequeueUntilRestartsAreSpent) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit(/*max_restarts=*/1);
  const v1::Assignment first = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(first), Exited(first, 1)}).ok());
  // Requeued and, the device being free, scheduled again as attempt 2.
  v1::Job j = Get(job.id());
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  const v1::Assignment second = StartOf(Drain(w), job.id());
  EXPECT_EQ(second.attempt(), 2);
  ASSERT_TRUE(Report(w, {Started(second), Exited(second, 137)}).ok());
  j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.failure_reason(), HasSubstr("restarts spent"));
}

TEST_F(CoordinatorTest, EventsOfAnOlderAttemptAreDropped) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment first = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(first), Exited(first, 1)}).ok());
  const v1::Assignment second = StartOf(Drain(w), job.id());
  ASSERT_EQ(second.attempt(), 2);
  const int64_t seq = Get(job.id()).last_seq();
  ASSERT_TRUE(Report(w, {Step(first, 50)}).ok());
  EXPECT_EQ(Get(job.id()).last_seq(), seq);
  EXPECT_EQ(Get(job.id()).step(), 0);
}

TEST_F(CoordinatorTest, RepeatedReportIdIsAckedButAppliedOnce) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  v1::ReportEventsRequest r;
  r.set_worker_id(w);
  r.set_report_id(5);
  *r.add_events() = Step(a, 1);
  ASSERT_TRUE(c_->ReportEvents(r).ok());
  const int64_t seq = Get(job.id()).last_seq();
  auto again = c_->ReportEvents(r);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->acked_report_id(), 5);
  EXPECT_EQ(Get(job.id()).last_seq(), seq);
}

TEST_F(CoordinatorTest, LeaseExpiryRequeuesAndAReturningWorkerStopsItsStaleRank) {
  const std::string w1 = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w1), job.id());
  ASSERT_TRUE(Report(w1, {Started(a), Step(a, 3)}).ok());
  now_ += kLeaseMs + 1;
  c_->ExpireLeases();
  v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_THAT(j.failure_reason(), HasSubstr("lost its lease"));
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w1);
  EXPECT_EQ(c_->Heartbeat(hb).status().code(), absl::StatusCode::kNotFound);

  // It comes back still running attempt 1: that rank is stopped, and the job
  // starts again as attempt 2 on the free device.
  v1::RankRef ref;
  ref.set_job_id(job.id());
  ref.set_attempt(1);
  ref.set_rank(0);
  Register("node-1", 2, {ref}, w1);
  const std::vector<v1::Assignment> sent = Drain(w1);
  bool stopped_old = false;
  for (const v1::Assignment& s : sent) {
    stopped_old |= s.action() == v1::Assignment::ACTION_STOP && s.attempt() == 1;
  }
  EXPECT_TRUE(stopped_old);
  EXPECT_EQ(StartOf(sent, job.id()).attempt(), 2);
}

TEST_F(CoordinatorTest, EachRankIsToldThePathRootsToCheckThePathsAgainItself) {
  path_roots_ = {dir_.path().string()};
  Reopen();
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment start = StartOf(Drain(w), job.id());
  EXPECT_THAT(start.path_roots(), ::testing::ElementsAre(dir_.path().string()));
}

TEST_F(CoordinatorTest, LostWorkersJobWaitsForItsRanksToFenceThemselvesBeforeItRunsElsewhere) {
  agent_silence_ms_ = 500;
  Reopen();
  const int64_t t0 = now_;
  const std::string w1 = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment first = StartOf(Drain(w1), job.id());
  EXPECT_EQ(first.agent_silence_ms(), 500) << "the rank learns its fence";
  ASSERT_TRUE(Report(w1, {Started(first), Step(first, 3)}).ok());
  const std::string w2 = Register("node-2", 1);

  // w1's lease runs out: it is dead, but its rank may still be running.
  now_ = t0 + kLeaseMs + 1;
  Heartbeat(w2);
  c_->ExpireLeases();
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w1);
  EXPECT_EQ(c_->Heartbeat(hb).status().code(), absl::StatusCode::kNotFound);
  // Until the silence limit and the margin have passed, the job stays where it is.
  now_ = t0 + kLeaseMs + 500 + Coordinator::kFenceMarginMs;
  Heartbeat(w2);
  c_->ExpireLeases();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(Drain(w2).empty()) << "a second rank started while the first may run";

  now_ += 1;
  Heartbeat(w2);
  c_->ExpireLeases();
  v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_THAT(j.failure_reason(), HasSubstr("fenced after 1500 ms"));
  const v1::Assignment second = StartOf(Drain(w2), job.id());
  EXPECT_EQ(second.attempt(), 2);

  // w1 thaws and reports what its old rank did: refused, and that rank is
  // told to stop.
  Register("node-1", 1, {Ref(first)}, w1);
  bool stopped_old = false;
  for (const v1::Assignment& s : Drain(w1)) {
    stopped_old |= s.action() == v1::Assignment::ACTION_STOP && s.attempt() == 1;
  }
  EXPECT_TRUE(stopped_old);
  const int64_t seq = Get(job.id()).last_seq();
  ASSERT_TRUE(Report(w1, {Step(first, 4), Exited(first, 3)}).ok());
  j = Get(job.id());
  EXPECT_EQ(j.last_seq(), seq);
  EXPECT_EQ(j.step(), 3);
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
}

TEST_F(CoordinatorTest, WorkerBackWithinTheFenceWaitKeepsItsRankAndTheJobItsAttempt) {
  agent_silence_ms_ = 500;
  Reopen();
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 3)}).ok());
  now_ += kLeaseMs + 1;
  c_->ExpireLeases();
  Register("node-1", 1, {Ref(a)}, w);
  // Past the point where its ranks would have been given up, had it stayed away.
  now_ += 500 + Coordinator::kFenceMarginMs;
  Heartbeat(w);
  c_->ExpireLeases();
  ASSERT_TRUE(Report(w, {Step(a, 4)}).ok());
  const v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.step(), 4);
  EXPECT_EQ(j.restarts(), 0);
}

TEST_F(CoordinatorTest, RestartLosesNoJobAndReadoptsRunningRanks) {
  const std::string w = Register("node-1", 1);
  const v1::Job running = Submit();
  const v1::Job queued = Submit();  // no device left for it
  const v1::Assignment a = StartOf(Drain(w), running.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 4)}).ok());

  Reopen();
  EXPECT_EQ(Get(queued.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Get(running.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(running.id()).step(), 4);
  v1::RankRef ref;
  ref.set_job_id(running.id());
  ref.set_attempt(1);
  ref.set_rank(0);
  Register("node-1", 1, {ref}, w);
  // Within the new lease nothing is requeued; the rank keeps reporting.
  now_ += kLeaseMs / 2;
  c_->ExpireLeases();
  ASSERT_TRUE(Report(w, {Step(a, 5)}).ok());
  EXPECT_EQ(Get(running.id()).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(running.id()).step(), 5);
  EXPECT_EQ(Get(running.id()).restarts(), 0);
  ASSERT_TRUE(Report(w, {Exited(a, 0)}).ok());
  EXPECT_EQ(Get(running.id()).state(), v1::JOB_STATE_SUCCEEDED);
  // The freed device goes to the queued job.
  EXPECT_EQ(Get(queued.id()).state(), v1::JOB_STATE_SCHEDULED);
}

TEST_F(CoordinatorTest, WorkerThatDoesNotReturnAfterRestartLosesItsJobsAfterOneLease) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a)}).ok());
  Reopen();
  now_ += kLeaseMs + 1;
  c_->ExpireLeases();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
}

TEST_F(CoordinatorTest, CancelQueuedIsImmediate) {
  const v1::Job job = Submit();
  auto cancelled = c_->CancelJob(job.id());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  // Terminal: returned unchanged.
  EXPECT_EQ(c_->CancelJob(job.id())->last_seq(), cancelled->last_seq());
  Register("node-1", 1);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, CancelRunningStopsRanksThenCancels) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a)}).ok());
  EXPECT_EQ(c_->CancelJob(job.id())->state(), v1::JOB_STATE_CANCELLING);
  const std::vector<v1::Assignment> sent = Drain(w);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(sent[0].grace_ms(), 5);
  ASSERT_TRUE(Report(w, {Exited(a, 143)}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, CancelCompletesWhenTheWorkerIsLost) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a)}).ok());
  ASSERT_TRUE(c_->CancelJob(job.id()).ok());
  now_ += kLeaseMs + 1;
  c_->ExpireLeases();
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorTest, RollbackStopsRanksAndRequeuesToResumeWithoutCountingARestart) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit(/*max_restarts=*/0);
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 40)}).ok());
  EXPECT_EQ(c_->RollbackJob(job.id(), 41).status().code(), absl::StatusCode::kInvalidArgument);
  auto rolling = c_->RollbackJob(job.id(), 20);
  ASSERT_TRUE(rolling.ok()) << rolling.status();
  EXPECT_EQ(rolling->state(), v1::JOB_STATE_ROLLING_BACK);
  EXPECT_EQ(Drain(w).at(0).action(), v1::Assignment::ACTION_STOP);
  ASSERT_TRUE(Report(w, {Exited(a, 143)}).ok());
  const v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(j.restarts(), 0);
  const v1::Assignment next = StartOf(Drain(w), job.id());
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(next.resume_at_or_before(), 20);
}

TEST_F(CoordinatorTest, RollbackToStepZeroStartsOverEvenAcrossARestart) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit(/*max_restarts=*/0);
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 40)}).ok());
  EXPECT_EQ(c_->RollbackJob(job.id(), -1).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(c_->RollbackJob(job.id(), 0).ok());
  EXPECT_EQ(Drain(w).at(0).action(), v1::Assignment::ACTION_STOP);
  // The rank finishes its step before it stops: the target stays.
  ASSERT_TRUE(Report(w, {Step(a, 41)}).ok());
  // The target is stored; a coordinator restart keeps it (0 is not "none").
  Reopen();
  Register("node-1", 1, {Ref(a)}, w);
  ASSERT_TRUE(Report(w, {Exited(a, 143)}).ok());
  const v1::Assignment next = StartOf(Drain(w), job.id());
  ASSERT_TRUE(next.has_resume_at_or_before());
  EXPECT_EQ(next.resume_at_or_before(), 0);
}

TEST_F(CoordinatorTest, AnAssignmentWithoutARollbackHasNoResumeTarget) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  EXPECT_FALSE(StartOf(Drain(w), job.id()).has_resume_at_or_before());
}

TEST_F(CoordinatorTest, GuardEventsCountOnTheJobAndInTheCountersFromZero) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 1)}).ok());
  const std::string id = job.id();
  std::string text = metrics_->Encode();
  for (const char* kind :
       {"non_finite", "no_supervision", "spike", "collapse", "router_collapse"}) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("ballast_job_anomalies_total{job_id=\"", id,
                                             "\",kind=\"", kind, "\"} 0\n")));
  }
  EXPECT_THAT(text, HasSubstr("ballast_job_rollbacks_total{job_id=\"" + id + "\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_skipped_steps_total{job_id=\"" + id + "\"} 0\n"));

  auto guard = [&](v1::GuardEvent::Kind kind, int64_t step, const std::string& trigger) {
    v1::RankEvent e = Event(a);
    v1::GuardEvent* g = e.mutable_training()->mutable_guard();
    g->set_kind(kind);
    g->set_step(step);
    g->set_trigger(trigger);
    return e;
  };
  v1::RankEvent skipped = StepWithoutLoss(a, 2);
  skipped.mutable_training()->mutable_step_metrics()->set_skipped(true);
  v1::RankEvent also_skipped = StepWithoutLoss(a, 3);
  also_skipped.mutable_training()->mutable_step_metrics()->set_skipped(true);
  v1::RankEvent rollback = guard(v1::GuardEvent::KIND_ROLLBACK, 3, "non_finite");
  rollback.mutable_training()->mutable_guard()->set_to_step(1);
  ASSERT_TRUE(Report(w, {skipped, guard(v1::GuardEvent::KIND_SKIP, 2, "non_finite"), also_skipped,
                         rollback, guard(v1::GuardEvent::KIND_RECOVERED, 5, "spike")})
                  .ok());
  Reopen();  // what the job says survives a coordinator restart
  const v1::Job j = Get(id);
  EXPECT_EQ(j.guard_rollbacks(), 1);
  EXPECT_EQ(j.skipped_steps(), 2);
  EXPECT_EQ(j.anomalies().at("non_finite"), 2);
  EXPECT_EQ(j.anomalies().at("spike"), 1);
  EXPECT_EQ(j.last_guard_event().kind(), v1::GuardEvent::KIND_RECOVERED);
  text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_job_rollbacks_total{job_id=\"" + id + "\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_skipped_steps_total{job_id=\"" + id + "\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_anomalies_total{job_id=\"" + id +
                              "\",kind=\"non_finite\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("ballast_job_anomalies_total{job_id=\"" + id + "\",kind=\"spike\"} 1\n"));
}

TEST_F(CoordinatorTest, RollbackOfATerminalJobIsFailedPrecondition) {
  const v1::Job job = Submit();
  ASSERT_TRUE(c_->CancelJob(job.id()).ok());
  EXPECT_EQ(c_->RollbackJob(job.id(), 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, ListJobsFiltersByStateAndPagesNewestFirst) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(Submit().id());
  ASSERT_TRUE(c_->CancelJob(ids[1]).ok());
  v1::ListJobsRequest r;
  r.set_page_size(2);
  r.add_states(v1::JOB_STATE_QUEUED);
  std::vector<std::string> seen;
  do {
    auto page = c_->ListJobs(r);
    ASSERT_TRUE(page.ok()) << page.status();
    for (const v1::Job& j : page->jobs()) seen.push_back(j.id());
    r.set_page_token(page->next_page_token());
  } while (!r.page_token().empty());
  EXPECT_EQ(seen, (std::vector<std::string>{ids[4], ids[3], ids[2], ids[0]}));
  r.set_page_token("garbage");
  EXPECT_EQ(c_->ListJobs(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_page_token("");
  r.set_page_size(1001);
  EXPECT_EQ(c_->ListJobs(r).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, TheHistoryKeepsTheNewestFinishedJobsAndPrunesTheRest) {
  finished_jobs_kept_ = 2;
  job_history_ = 3;
  Reopen();
  const std::vector<v1::Job> done = SubmitCancelled(6);
  const v1::Job live = Submit();
  // Jobs 4 and 5 are in memory, 0..3 in the store; the history keeps 3 of 4
  // and 5 in memory, so job 3 stays and 0..2 go.
  c_->PruneHistory();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c_->GetJob(done[i].id()).status().code(), absl::StatusCode::kNotFound) << i;
  }
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(c_->GetJob(done[i].id()).ok()) << i;
  EXPECT_TRUE(c_->GetJob(live.id()).ok());
  auto listed = c_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->jobs_size(), 4);
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_jobs{state=\"cancelled\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("ballast_jobs_pruned_total 3\n"));
  // A pruned job's request_id is free again: a new job, not the old one.
  absl::StatusOr<v1::Job> again = c_->SubmitJob(ValidSpec(dir_.path()), "req-0");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->id(), done[0].id());
  // Nothing more to prune, also after a restart.
  Reopen();
  c_->PruneHistory();
  EXPECT_TRUE(c_->GetJob(done[3].id()).ok());
  EXPECT_THAT(metrics_->Encode(), HasSubstr("ballast_jobs{state=\"cancelled\"} 3\n"));
}

// Memory holds the live jobs and the newest finished ones; every read of
// an older job comes from the store and answers as it did before.
TEST_F(CoordinatorTest, FinishedJobsLeaveMemoryAndEveryReadStillFindsThem) {
  finished_jobs_kept_ = 2;
  Reopen();
  const std::vector<v1::Job> done = SubmitCancelled(6);
  const v1::Job live = Submit();
  ASSERT_TRUE(c_->GetJob(live.id()).ok());
  auto in_memory = [&] {
    const std::string text = metrics_->Encode();
    const std::string key = "\nballast_jobs_in_memory ";
    const size_t at = text.find(key);
    if (at == std::string::npos) return std::string("none");
    const size_t from = at + key.size();
    return text.substr(from, text.find('\n', from) - from);
  };
  // Jobs 0..3 left: each was evicted by a later Flush once its record said so.
  EXPECT_EQ(in_memory(), "3");
  EXPECT_THAT(metrics_->Encode(), HasSubstr("ballast_jobs{state=\"cancelled\"} 6\n"));

  auto check_reads = [&] {
    absl::StatusOr<v1::Job> old = c_->GetJob(done[0].id());
    ASSERT_TRUE(old.ok()) << old.status();
    EXPECT_EQ(old->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(c_->GetJob(done[0].id(), "another-tenant").status().code(),
              absl::StatusCode::kNotFound);
    // Newest first across memory and store, page by page.
    v1::ListJobsRequest r;
    r.set_page_size(2);
    std::vector<std::string> listed;
    do {
      auto page = c_->ListJobs(r);
      ASSERT_TRUE(page.ok()) << page.status();
      for (const v1::Job& j : page->jobs()) listed.push_back(j.id());
      r.set_page_token(page->next_page_token());
    } while (!r.page_token().empty());
    std::vector<std::string> expected = {live.id()};
    for (int i = 5; i >= 0; --i) expected.push_back(done[i].id());
    EXPECT_EQ(listed, expected);
    v1::ListJobsRequest queued;
    queued.add_states(v1::JOB_STATE_QUEUED);
    ASSERT_EQ(c_->ListJobs(queued)->jobs_size(), 1);
    EXPECT_EQ(c_->ListJobs(v1::ListJobsRequest(), "another-tenant")->jobs_size(), 0);
    // The same request_id returns the same job, and nothing new is made.
    absl::StatusOr<v1::Job> again = c_->SubmitJob(ValidSpec(dir_.path()), "req-0");
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->id(), done[0].id());
    EXPECT_EQ(again->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(c_->CancelJob(done[0].id())->state(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(c_->RollbackJob(done[0].id(), 0).status().code(),
              absl::StatusCode::kFailedPrecondition);
    // Its events replay from the store and end at the terminal one.
    auto watch = c_->WatchJob(done[0].id(), 0);
    ASSERT_TRUE(watch.ok()) << watch.status();
    std::vector<v1::JobEvent> events;
    absl::StatusOr<bool> more = (*watch)->Next(&events, absl::Seconds(1));
    ASSERT_TRUE(more.ok());
    EXPECT_FALSE(*more);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events.back().state_change().to(), v1::JOB_STATE_CANCELLED);
    EXPECT_EQ(events.back().seq(), old->last_seq());
  };
  check_reads();
  // A restart loads only what was in memory, and counts the rest.
  Reopen();
  EXPECT_EQ(in_memory(), "3");
  EXPECT_THAT(metrics_->Encode(), HasSubstr("ballast_jobs{state=\"cancelled\"} 6\n"));
  check_reads();
  EXPECT_EQ(in_memory(), "3");
}

TEST_F(CoordinatorTest, ListJobsPagesByBytesSoThatLargeSpecsNeverOverflowAReply) {
  const v1::Job first = Submit();
  const size_t one_job = first.ByteSizeLong();
  const v1::Job second = Submit(), third = Submit();
  // A page holds what fits in the budget, and at least one job.
  for (const size_t budget : {size_t{1}, 2 * one_job + 16}) {
    SCOPED_TRACE(budget);
    list_page_bytes_ = budget;
    Reopen();
    v1::ListJobsRequest request;
    std::vector<std::string> listed;
    do {
      auto page = c_->ListJobs(request);
      ASSERT_TRUE(page.ok()) << page.status();
      EXPECT_LE(page->jobs_size(), budget == 1 ? 1 : 2);
      for (const v1::Job& j : page->jobs()) listed.push_back(j.id());
      request.set_page_token(page->next_page_token());
    } while (!request.page_token().empty());
    EXPECT_THAT(listed, ::testing::ElementsAre(third.id(), second.id(), first.id()));
  }
}

TEST_F(CoordinatorTest, WatchReplaysAfterSeqThenStreamsLiveEventsUntilTerminal) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 1)}).ok());
  const int64_t seen = Get(job.id()).last_seq();
  auto watch = c_->WatchJob(job.id(), seen - 1);
  ASSERT_TRUE(watch.ok());
  std::vector<v1::JobEvent> got;
  ASSERT_TRUE(*(*watch)->Next(&got, absl::ZeroDuration()));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].seq(), seen);
  EXPECT_EQ(got[0].training().step_metrics().step(), 1);
  ASSERT_TRUE(Report(w, {Step(a, 2), Exited(a, 0)}).ok());
  got.clear();
  absl::StatusOr<bool> more = (*watch)->Next(&got, absl::Seconds(5));
  ASSERT_TRUE(more.ok());
  EXPECT_FALSE(*more) << "the stream ends with the terminal state change";
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].seq(), seen + 1);
  EXPECT_EQ(got[1].state_change().to(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, SlowWatcherMissesNothingStillRetained) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  auto watch = c_->WatchJob(job.id(), 0);
  ASSERT_TRUE(watch.ok());
  // Far more than a watcher's mailbox holds, while it does not read, and
  // fewer than retention keeps.
  for (int batch = 0; batch < 5; ++batch) {
    std::vector<v1::RankEvent> events;
    for (int i = 1; i <= 1000; ++i) events.push_back(Step(a, batch * 1000 + i));
    ASSERT_TRUE(Report(w, std::move(events)).ok());
  }
  const int64_t last = Get(job.id()).last_seq();
  std::vector<v1::JobEvent> got;
  for (int i = 0; i < 100 && (got.empty() || got.back().seq() < last); ++i) {
    ASSERT_TRUE((*watch)->Next(&got, absl::Milliseconds(10)).ok());
  }
  ASSERT_EQ(static_cast<int64_t>(got.size()), last);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i].seq(), int64_t(i + 1));
}

TEST_F(CoordinatorTest, RetentionDeletesOldEventsAndCountsThem) {
  retention_ = 5;
  Reopen();
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  std::vector<v1::RankEvent> steps;
  for (int i = 1; i <= 20; ++i) steps.push_back(Step(a, i));
  ASSERT_TRUE(Report(w, std::move(steps)).ok());
  const std::vector<v1::JobEvent> events = Events(job.id());
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events.back().seq(), Get(job.id()).last_seq());
  const int64_t dropped = Get(job.id()).last_seq() - 5;
  EXPECT_THAT(metrics_->Encode(),
              HasSubstr("ballast_events_dropped_total " + std::to_string(dropped) + "\n"));
}

TEST_F(CoordinatorTest, MetricsExportJobStatesAndPerJobSeries) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 9)}).ok());
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_jobs{state=\"running\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_jobs{state=\"queued\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_jobs{state=\"failed\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_step{job_id=\"" + job.id() + "\"} 9\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_loss{job_id=\"" + job.id() + "\"} 2.5\n"));
  EXPECT_THAT(text, HasSubstr("ballast_worker_devices{state=\"busy\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_workers{state=\"alive\"} 1\n"));
}

TEST_F(CoordinatorTest, LastStepSurvivesARestartOnTheJobInListJobsAndInTheGauges) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), StepWithoutLoss(a, 6), Step(a, 7)}).ok());

  Reopen();
  const v1::Job after = Get(job.id());
  ASSERT_TRUE(after.has_last_step());
  EXPECT_EQ(after.last_step().step(), 7);
  EXPECT_EQ(after.last_step().loss(), 2.5);
  auto listed = c_->ListJobs(v1::ListJobsRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_EQ(listed->jobs(0).last_step().step(), 7);
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_job_loss{job_id=\"" + job.id() + "\"} 2.5\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_grad_norm{job_id=\"" + job.id() + "\"} 0.75\n"));
}

TEST_F(CoordinatorTest, AStepWithoutLossHasNoLossSampleButKeepsItsOtherGauges) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  ASSERT_TRUE(Report(w, {Started(a), Step(a, 1), StepWithoutLoss(a, 2)}).ok());
  const v1::Job after = Get(job.id());
  EXPECT_EQ(after.last_step().step(), 2);
  EXPECT_FALSE(after.last_step().has_loss());
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, Not(HasSubstr("ballast_job_loss{job_id=\"" + job.id() + "\"}")));
  EXPECT_THAT(text, HasSubstr("ballast_job_grad_norm{job_id=\"" + job.id() + "\"} 0.75\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_step{job_id=\"" + job.id() + "\"} 2\n"));
}

// A Mixture-of-Experts job's step carries its routing: the two MoE gauges
// have its values; a dense job's step has none, and no MoE series.
TEST_F(CoordinatorTest, MoeGaugesComeFromAMoeStepOnlyAndADenseJobHasNone) {
  const std::string w = Register("node-1", 2);
  const v1::Job moe = Submit();
  const v1::Job dense = Submit();
  const std::vector<v1::Assignment> assigned = Drain(w);
  const v1::Assignment a = StartOf(assigned, moe.id());
  const v1::Assignment b = StartOf(assigned, dense.id());
  v1::RankEvent step = Step(a, 3);
  v1::StepMetrics* m = step.mutable_training()->mutable_step_metrics();
  m->set_aux_loss(1.125);
  m->mutable_moe()->set_expert_load_max_ratio(3.5);
  ASSERT_TRUE(Report(w, {Started(a), step, Started(b), Step(b, 3)}).ok());
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_job_moe_aux_loss{job_id=\"" + moe.id() + "\"} 1.125\n"));
  EXPECT_THAT(
      text, HasSubstr("ballast_job_moe_expert_load_max_ratio{job_id=\"" + moe.id() + "\"} 3.5\n"));
  EXPECT_THAT(text, Not(HasSubstr("ballast_job_moe_aux_loss{job_id=\"" + dense.id())));
  EXPECT_THAT(text, Not(HasSubstr("ballast_job_moe_expert_load_max_ratio{job_id=\"" + dense.id())));
  EXPECT_THAT(text, HasSubstr("ballast_job_loss{job_id=\"" + dense.id() + "\"} 2.5\n"));
}

TEST_F(CoordinatorTest, AJobBeforeItsFirstStepHasNoPerStepSamples) {
  const v1::Job job = Submit();
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_job_step{job_id=\"" + job.id() + "\"} 0\n"));
  for (const char* gauge : {"ballast_job_loss", "ballast_job_grad_norm",
                            "ballast_job_learning_rate", "ballast_job_tokens_per_second"}) {
    EXPECT_THAT(text, Not(HasSubstr(absl::StrCat(gauge, "{job_id=\"", job.id(), "\"}"))));
  }
}

TEST_F(CoordinatorTest, TrainingEventsReachWatchersAsTheRankSentThemWithTheirAttempt) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit();
  const v1::Assignment a = StartOf(Drain(w), job.id());
  v1::RankEvent log = Event(a);
  v1::LogLine* line = log.mutable_training()->mutable_log();
  line->set_rank(0);
  line->set_level("warning");
  line->set_text("slow data");
  // A kind newer than this coordinator: field 15 of TrainingEvent, which it
  // does not know.
  const std::string wire = std::string("\x7a\x06") + "future";
  v1::RankEvent future = Event(a);
  ASSERT_TRUE(future.mutable_training()->ParseFromString(wire));
  ASSERT_EQ(future.training().kind_case(), v1::TrainingEvent::KIND_NOT_SET);
  ASSERT_TRUE(Report(w, {Started(a), log, future}).ok());

  const std::vector<v1::JobEvent> events = Events(job.id());
  ASSERT_GE(events.size(), 2u);
  const v1::JobEvent& got_log = events[events.size() - 2];
  EXPECT_EQ(got_log.training().SerializeAsString(), log.training().SerializeAsString());
  EXPECT_EQ(got_log.attempt(), a.attempt());
  EXPECT_EQ(events.back().training().SerializeAsString(), wire);
  EXPECT_EQ(events.back().attempt(), a.attempt());
}

// A worker is trusted to bound its events (EventRelay) but checked: an
// oversized event is stored as a warning saying so, and an exit with a long
// tail still frees its rank.
TEST_F(CoordinatorTest, AnOversizedEventIsStoredAsAWarningAndAnExitStillLands) {
  const std::string w = Register("node-1", 1);
  const v1::Job job = Submit(/*max_restarts=*/0);
  const v1::Assignment a = StartOf(Drain(w), job.id());
  v1::RankEvent huge = Event(a);
  huge.mutable_training()->mutable_log()->set_text(std::string(1 << 20, 'h'));
  ASSERT_TRUE(Report(w, {Started(a), huge}).ok());
  const std::vector<v1::JobEvent> events = Events(job.id());
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events.back().training().log().text(), HasSubstr("dropped a log event of 1048"));
  EXPECT_LT(events.back().ByteSizeLong(), 1024u);

  ASSERT_TRUE(Report(w, {Exited(a, 1, std::string(64 << 10, 't') + "last words")}).ok());
  const v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j.failure_reason(), HasSubstr("last words"));
  EXPECT_LT(j.failure_reason().size(), kMaxStderrTailBytes + 256);
}

TEST_F(CoordinatorTest, BadWorkerRegistrationIsInvalidArgument) {
  v1::RegisterWorkerRequest r;
  r.set_host("node");
  r.set_device_kind("tpu");
  r.set_capacity(1);
  EXPECT_EQ(c_->RegisterWorker(r).status().code(), absl::StatusCode::kInvalidArgument);
  r.set_device_kind("cuda");
  r.set_capacity(0);
  EXPECT_EQ(c_->RegisterWorker(r).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Gangs: one job, several ranks

TEST_F(CoordinatorTest, AGangSpreadsOverWorkersAndEveryRankMeetsAtRank0sHost) {
  const std::string w1 = Register("node-1", 2);
  const std::string w2 = Register("node-2", 2);
  const v1::Job job = SubmitGang(4);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SCHEDULED);
  const auto starts = GangStarts({w1, w2}, job.id());
  ASSERT_EQ(starts.size(), 4u);
  const std::string rank0_host = starts.at(0).first == w1 ? "node-1" : "node-2";
  std::map<std::string, int> per_worker;
  for (const auto& [rank, start] : starts) {
    const v1::Assignment& a = start.second;
    EXPECT_EQ(a.rank(), rank);
    EXPECT_EQ(a.world_size(), 4);
    EXPECT_EQ(a.attempt(), 1);
    EXPECT_EQ(a.master_addr(), rank0_host) << "rank " << rank;
    EXPECT_EQ(a.master_port(), starts.at(0).second.master_port()) << "rank " << rank;
    ++per_worker[start.first];
  }
  EXPECT_EQ(per_worker[w1], 2);
  EXPECT_EQ(per_worker[w2], 2);
  EXPECT_EQ(Get(job.id()).placement_size(), 4);
}

TEST_F(CoordinatorTest, AGangSucceedsOnlyWhenEveryRankExitsZero) {
  const std::string w1 = Register("node-1", 2);
  const std::string w2 = Register("node-2", 2);
  const v1::Job job = SubmitGang(4);
  const auto starts = GangStarts({w1, w2}, job.id());
  ASSERT_EQ(starts.size(), 4u);
  for (int32_t rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(Report(starts.at(rank).first, {Started(starts.at(rank).second)}).ok());
  }
  for (int32_t rank = 0; rank < 3; ++rank) {
    const auto& [w, a] = starts.at(rank);
    ASSERT_TRUE(Report(w, {Exited(a, 0)}).ok());
    EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING) << "after rank " << rank;
  }
  ASSERT_TRUE(Report(starts.at(3).first, {Exited(starts.at(3).second, 0)}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, ARankFailureStopsItsPeersAndTheNextAttemptWaitsUntilAllAreGone) {
  const std::string w1 = Register("node-1", 2);
  const std::string w2 = Register("node-2", 2);
  const v1::Job job = SubmitGang(4, /*max_restarts=*/1);
  auto starts = GangStarts({w1, w2}, job.id());
  ASSERT_EQ(starts.size(), 4u);
  for (const auto& [rank, start] : starts) {
    ASSERT_TRUE(Report(start.first, {Started(start.second), Step(start.second, 3)}).ok());
  }
  // Rank 2 dies (kill -9): the job is requeued, every other rank is asked
  // to stop, and nothing starts while they still run.
  ASSERT_TRUE(Report(starts.at(2).first, {Exited(starts.at(2).second, 137)}).ok());
  v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_THAT(j.failure_reason(), HasSubstr("rank 2 exited with code 137"));
  std::set<int32_t> stopped;
  for (const std::string& w : {w1, w2}) {
    for (const v1::Assignment& a : Drain(w)) {
      EXPECT_EQ(a.action(), v1::Assignment::ACTION_STOP) << "nothing starts yet";
      EXPECT_EQ(a.attempt(), 1);
      stopped.insert(a.rank());
    }
  }
  EXPECT_EQ(stopped, (std::set<int32_t>{0, 1, 3}));
  // The peers notice the lost rank and exit 1 themselves, or stop: neither
  // counts as another failure of the attempt.
  ASSERT_TRUE(Report(starts.at(0).first, {Exited(starts.at(0).second, 1, "lost rank 2")}).ok());
  ASSERT_TRUE(Report(starts.at(1).first, {Exited(starts.at(1).second, 143)}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(GangStarts({w1, w2}, job.id()).empty());
  ASSERT_TRUE(Report(starts.at(3).first, {Exited(starts.at(3).second, 1)}).ok());
  j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(j.restarts(), 1);

  // Attempt 2: all four ranks again, at a port of their own.
  const auto second = GangStarts({w1, w2}, job.id());
  ASSERT_EQ(second.size(), 4u);
  for (const auto& [rank, start] : second) {
    EXPECT_EQ(start.second.attempt(), 2);
    EXPECT_EQ(start.second.world_size(), 4);
    EXPECT_NE(start.second.master_port(), starts.at(0).second.master_port());
  }
  for (const auto& [rank, start] : second) {
    ASSERT_TRUE(Report(start.first, {Started(start.second), Exited(start.second, 0)}).ok());
  }
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, RanksThatExitedZeroBeforeARestartStillCountAfterIt) {
  const auto [w1, job, r0, r1] = StartTwoRanks();
  ASSERT_FALSE(job.id().empty());
  ASSERT_TRUE(Report(w1, {Started(r0), Started(r1), Exited(r1, 0)}).ok());
  EXPECT_EQ(Get(job.id()).placement(1).exit_code(), 0);

  // ballastd restarts; the worker comes back running rank 0 only, which is
  // all that is left of the gang, and rank 0 then finishes.
  Reopen();
  Register("node-1", 2, {Ref(r0)}, w1);
  v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.restarts(), 0);
  ASSERT_TRUE(Report(w1, {Exited(r0, 0)}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorTest, ARankExitingTwoFailsTheGangAndStopsItsPeers) {
  const auto [w1, job, r0, r1] = StartTwoRanks();
  ASSERT_FALSE(job.id().empty());
  ASSERT_TRUE(Report(w1, {Started(r0), Started(r1)}).ok());
  ASSERT_TRUE(Report(w1, {Exited(r1, 2, "bad data: row 3\n")}).ok());
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_FAILED);
  const std::vector<v1::Assignment> sent = Drain(w1);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].action(), v1::Assignment::ACTION_STOP);
  EXPECT_EQ(sent[0].rank(), 0);
}

TEST_F(CoordinatorTest, OnlyRank0MovesTheJobWhileEveryRankHasItsOwnSeries) {
  const auto [w1, job, r0, r1] = StartTwoRanks();
  ASSERT_FALSE(job.id().empty());
  auto step = [](const v1::Assignment& a, int64_t n, int64_t memory, int64_t bytes) {
    v1::RankEvent e = Step(a, n);
    v1::StepMetrics* m = e.mutable_training()->mutable_step_metrics();
    m->set_step_time_s(0.2);
    m->set_peak_memory_bytes(memory);
    m->set_communicated_bytes(bytes);
    m->set_replica_communicated_bytes(bytes / 4);
    m->set_collective_wait_s(0.05);
    return e;
  };
  ASSERT_TRUE(Report(w1, {Started(r0), Started(r1)}).ok());
  const int64_t seq = Get(job.id()).last_seq();
  // Rank 1 runs ahead of rank 0: the job's step does not move, and its copy
  // of the global step is no event of the job.
  ASSERT_TRUE(Report(w1, {step(r1, 1, 1000, 64), step(r1, 2, 3000, 64)}).ok());
  EXPECT_EQ(Get(job.id()).step(), 0);
  EXPECT_EQ(Get(job.id()).last_seq(), seq);
  ASSERT_TRUE(Report(w1, {step(r0, 1, 2000, 32), step(r0, 2, 2500, 32)}).ok());
  const v1::Job j = Get(job.id());
  EXPECT_EQ(j.step(), 2);
  EXPECT_EQ(j.last_seq(), seq + 2) << "one event per step, from rank 0";

  const std::string text = metrics_->Encode();
  const std::string r0_labels = "{job_id=\"" + job.id() + "\",rank=\"0\"";
  const std::string r1_labels = "{job_id=\"" + job.id() + "\",rank=\"1\"";
  EXPECT_THAT(text, HasSubstr("ballast_job_step{job_id=\"" + job.id() + "\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_peak_memory_bytes" + r0_labels + "} 2500\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_peak_memory_bytes" + r1_labels + "} 3000\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_communicated_bytes_total" + r0_labels + "} 64\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_communicated_bytes_total" + r1_labels + "} 128\n"));
  EXPECT_THAT(text,
              HasSubstr("ballast_rank_replica_communicated_bytes_total" + r1_labels + "} 32\n"));
  EXPECT_THAT(text,
              HasSubstr("ballast_rank_collective_wait_seconds_total" + r0_labels + "} 0.1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_step_seconds_count" + r1_labels + "} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("ballast_rank_step_seconds_bucket" + r0_labels + ",le=\"0.25\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE ballast_rank_step_seconds histogram\n"));
}

// The progress watchdog (progress_watch.h): a job whose ranks and worker are
// all alive but complete no step for the bound (the default: 120 s, above
// 10 x its 1 s steps) is stalled with every rank's last phase, its ranks are
// stopped, and it restarts, counted. Phases are its input, not the job's
// events.
TEST_F(CoordinatorTest, AJobWithoutAStepForTheBoundIsStalledAndRestarted) {
  const auto [w1, job, r0, r1] = StartTwoRanks();
  ASSERT_FALSE(job.id().empty());
  auto step = [](const v1::Assignment& a, int64_t n) {
    v1::RankEvent e = Step(a, n);
    e.mutable_training()->mutable_step_metrics()->set_step_time_s(1.0);
    return e;
  };
  auto phase = [&](const v1::Assignment& a, const std::string& name, const std::string& collective,
                   int64_t seq, int32_t layer) {
    v1::RankEvent e = Event(a);
    v1::RankPhase* p = e.mutable_training()->mutable_phase();
    p->set_rank(a.rank());
    p->set_step(3);
    p->set_phase(name);
    p->set_collective(collective);
    p->set_collective_seq(seq);
    p->set_layer(layer);
    p->set_since_ms(now_.load());
    return e;
  };
  ASSERT_TRUE(
      Report(w1, {Started(r0), Started(r1), step(r0, 1), step(r1, 1), step(r0, 2), step(r1, 2)})
          .ok());
  const int64_t seq = Get(job.id()).last_seq();
  ASSERT_TRUE(
      Report(w1, {phase(r0, "data", "", 0, -1), phase(r1, "collective", "all_gather", 4182, 17)})
          .ok());
  EXPECT_EQ(Get(job.id()).last_seq(), seq) << "a phase is no event of the job";
  Drain(w1);
  // The worker keeps its lease all along (heartbeats every half lease).
  auto wait = [&](int64_t ms) {
    for (int64_t t = 0; t < ms; t += kLeaseMs / 2) {
      now_ += kLeaseMs / 2;
      Heartbeat(w1);
    }
    c_->WatchProgress();
  };
  wait(119'000);
  EXPECT_EQ(Get(job.id()).state(), v1::JOB_STATE_RUNNING);
  wait(2'000);
  const v1::Job j = Get(job.id());
  EXPECT_EQ(j.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(j.restarts(), 1);
  EXPECT_EQ(j.stalls(), 1);
  EXPECT_EQ(j.last_stall().step(), 3);
  EXPECT_DOUBLE_EQ(j.last_stall().bound_s(), 120);
  ASSERT_EQ(j.last_stall().ranks_size(), 2);
  EXPECT_EQ(j.last_stall().ranks(1).collective(), "all_gather");
  // (The lease thread may have declared it first, between 120 and 121 s.)
  EXPECT_THAT(j.failure_reason(), HasSubstr("stalled: no rank completed step 3 in 12"));
  EXPECT_THAT(j.failure_reason(), HasSubstr(" s (bound 120.0 s): rank 0 reading data for 12"));
  EXPECT_THAT(j.failure_reason(), HasSubstr(" s; rank 1 in all_gather #4182 of layer 17 for 12"));
  std::set<int32_t> stopped;
  for (const v1::Assignment& a : Drain(w1)) {
    EXPECT_EQ(a.action(), v1::Assignment::ACTION_STOP);
    stopped.insert(a.rank());
  }
  EXPECT_EQ(stopped, (std::set<int32_t>{0, 1}));
  const std::vector<v1::JobEvent> events = Events(job.id());
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const v1::JobEvent& e) { return e.training().has_stall(); }),
            1);
  EXPECT_EQ(std::count_if(events.begin(), events.end(),
                          [](const v1::JobEvent& e) { return e.training().has_phase(); }),
            0);
  // Once stalled, the attempt is not judged again while its ranks stop.
  wait(300'000);
  EXPECT_EQ(Get(job.id()).stalls(), 1);
}

// A straggler report (rank 0's StragglerWatch) moves the job's
// straggler_ranks and ballast_rank_straggler, both ways.
TEST_F(CoordinatorTest, AStragglerShowsOnTheJobAndInItsRankSeries) {
  const auto [w1, job, r0, r1] = StartTwoRanks();
  ASSERT_FALSE(job.id().empty());
  ASSERT_TRUE(
      Report(w1, {Started(r0), Started(r1), Step(r0, 1), Step(r1, 1), Straggler(r0, 1, true)})
          .ok());
  EXPECT_THAT(Get(job.id()).straggler_ranks(), ::testing::ElementsAre(1));
  const std::string r0_labels = "{job_id=\"" + job.id() + "\",rank=\"0\"}";
  const std::string r1_labels = "{job_id=\"" + job.id() + "\",rank=\"1\"}";
  std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_rank_straggler" + r0_labels + " 0\n"));
  EXPECT_THAT(text, HasSubstr("ballast_rank_straggler" + r1_labels + " 1\n"));
  ASSERT_TRUE(Report(w1, {Straggler(r0, 1, false)}).ok());
  EXPECT_THAT(Get(job.id()).straggler_ranks(), ::testing::ElementsAre());
  text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_rank_straggler" + r1_labels + " 0\n"));
}

// The devices a job's stragglers ran on are taken last by its later
// attempts, over every attempt, and the SCHEDULED reason says so.
TEST_F(CoordinatorTest, LaterAttemptsTakeTheStragglersDevicesLast) {
  const std::string w = Register("node-1", 3);
  const v1::Job job = SubmitGang(2, /*max_restarts=*/2);
  // Fails attempt `attempt`, whose rank `straggler` was reported a straggler
  // (and kept up again: a sighting counts for the attempt), and returns the
  // devices of the next attempt's ranks.
  auto next_attempt = [&](int32_t attempt, int32_t straggler) {
    const auto starts = GangStarts({w}, job.id());
    EXPECT_EQ(starts.size(), 2u);
    if (starts.size() != 2u) return std::vector<int32_t>();
    const v1::Assignment& r0 = starts.at(0).second;
    const v1::Assignment& r1 = starts.at(1).second;
    EXPECT_EQ(r0.attempt(), attempt);
    EXPECT_TRUE(Report(w, {Started(r0), Started(r1), Step(r0, 1), Step(r1, 1),
                           Straggler(r0, straggler, true), Straggler(r0, straggler, false),
                           Straggler(r0, straggler, true)})
                    .ok());
    EXPECT_THAT(Get(job.id()).straggler_ranks(), ::testing::ElementsAre(straggler));
    EXPECT_TRUE(Report(w, {Exited(r1, 137), Exited(r0, 143)}).ok());
    const v1::Job j = Get(job.id());
    EXPECT_EQ(j.state(), v1::JOB_STATE_SCHEDULED);
    // The new attempt's watch has judged nobody yet.
    EXPECT_THAT(j.straggler_ranks(), ::testing::ElementsAre());
    std::vector<int32_t> devices;
    for (const v1::RankPlacement& p : j.placement()) devices.push_back(p.device());
    return devices;
  };
  auto scheduled_reason = [&] {
    const std::vector<v1::JobEvent> events = Events(job.id());
    const auto it = std::find_if(events.rbegin(), events.rend(), [](const v1::JobEvent& e) {
      return e.state_change().to() == v1::JOB_STATE_SCHEDULED;
    });
    return it == events.rend() ? std::string() : it->state_change().reason();
  };
  // Attempt 1 on devices 0 and 1, rank 1 a straggler on 1: attempt 2
  // takes 0 and 2.
  EXPECT_EQ(next_attempt(1, 1), (std::vector<int32_t>{0, 2}));
  const std::string avoids_1 =
      absl::StrCat("avoids worker ", w, " device 1: rank 1 was a straggler there in attempt 1");
  EXPECT_EQ(scheduled_reason(),
            absl::StrCat("attempt 2 on 2 device(s), rank 0 on ", w, "; ", avoids_1));
  // Rank 0 a straggler on device 0 in attempt 2: attempt 3 avoids 0 and 1,
  // the worker has 3 free, so rank 1 gets one of them, the lowest.
  EXPECT_EQ(next_attempt(2, 0), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(scheduled_reason(),
            absl::StrCat("attempt 3 on 2 device(s), rank 0 on ", w, "; rank 1 on worker ", w,
                         " device 0 although rank 0 was a straggler there in attempt 2: ", w,
                         " had no other free device outside those avoided; ", avoids_1));
}

TEST_F(CoordinatorTest, RankSeriesLeaveWithTheJobsOtherSeries) {
  const std::string w1 = Register("node-1", 1);
  const v1::Job job = SubmitGang(1);
  const v1::Assignment a = StartOf(Drain(w1), job.id());
  ASSERT_TRUE(Report(w1, {Started(a), Step(a, 1), Exited(a, 0)}).ok());
  const std::string label = "ballast_rank_step_seconds_count{job_id=\"" + job.id() + "\"";
  EXPECT_THAT(metrics_->Encode(), HasSubstr(label));
  // A finished job's series stay for the retention time (10 minutes by
  // default), then go, its ranks' too, while a newer job's stay.
  now_ += 10 * 60 * 1000 - 1;
  const v1::Job later = Submit();
  ASSERT_TRUE(c_->CancelJob(later.id()).ok());
  EXPECT_THAT(metrics_->Encode(), HasSubstr(label));
  now_ += 2;
  EXPECT_THAT(metrics_->Encode(), Not(HasSubstr(label)));
  EXPECT_THAT(metrics_->Encode(), Not(HasSubstr("ballast_job_step{job_id=\"" + job.id())));
  EXPECT_THAT(metrics_->Encode(), HasSubstr("ballast_job_step{job_id=\"" + later.id()));
}

// Retention runs on the lease thread: a finished job past it is written
// evicted and leaves memory though nothing scrapes /metrics meanwhile.
TEST_F(CoordinatorTest, FinishedJobsLeaveMemoryAfterTheRetentionWithoutAScrape) {
  const v1::Job job = Submit();
  ASSERT_TRUE(c_->CancelJob(job.id()).ok());
  const v1::Job live = Submit();
  now_ += 10 * 60 * 1000 + 1;
  // The lease thread looks every 250 ms (kLeaseMs / 4); 10 s is ample.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool evicted = false;
  while (!evicted && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    absl::StatusOr<std::optional<JobRecord>> stored = store_->ReadJob(job.id());
    ASSERT_TRUE(stored.ok()) << stored.status();
    evicted = stored->has_value() && (*stored)->evicted;
  }
  ASSERT_TRUE(evicted) << "no lease pass wrote the finished job evicted";
  // A scrape only reads: the count falls to the live job by the lease
  // thread's next pass, which takes the stored eviction out of memory.
  std::string text;
  while (absl::Now() < deadline) {
    text = metrics_->Encode();
    if (text.find("\nballast_jobs_in_memory 1\n") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_THAT(text, HasSubstr("\nballast_jobs_in_memory 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_jobs{state=\"cancelled\"} 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("job_id=\"" + job.id())));
  EXPECT_THAT(text, HasSubstr("ballast_job_step{job_id=\"" + live.id()));
  ASSERT_TRUE(c_->GetJob(job.id()).ok()) << "read from the store";
}

TEST_F(CoordinatorTest, ControlPlaneLatenciesAreHistograms) {
  SubmitGang(1);  // no worker yet: it waits
  now_ += 1500;
  Register("node-1", 1);  // placed now, after 1.5 s in the queue
  const std::string text = metrics_->Encode();
  EXPECT_THAT(text, HasSubstr("ballast_job_queue_seconds_bucket{le=\"1\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_queue_seconds_bucket{le=\"10\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_job_queue_seconds_count 1\n"));
  EXPECT_THAT(text, HasSubstr("ballast_store_write_seconds_count{op=\"commit\"}"));
}

TEST_F(CoordinatorTest, SubmissionRefusesAGangLargerThanTheClusterCanPlace) {
  // No worker yet: the cluster may be starting, so the job waits.
  const v1::Job early = SubmitGang(8);
  EXPECT_EQ(early.state(), v1::JOB_STATE_QUEUED);

  const std::string w1 = Register("node-1", 2);
  const std::string w2 = Register("node-2", 2);
  v1::JobSpec spec = ValidSpec(dir_.path());
  spec.set_devices(8);
  spec.mutable_data()->set_grad_accum_steps(120);  // a multiple of every gang below
  auto refused = c_->SubmitJob(spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("devices 8: the largest gang this cluster can place is 4 (2 workers: "));
  EXPECT_THAT(refused.status().message(), HasSubstr(w1 + " 2 cpu"));
  EXPECT_THAT(refused.status().message(), HasSubstr(w2 + " 2 cpu"));
  EXPECT_TRUE(c_->SubmitJob(
                    [&] {
                      spec.set_devices(4);
                      return spec;
                    }(),
                    "")
                  .ok());

  // A gang is of one device kind: 4 CPU slots and 3 GPUs place at most 4.
  Register("gpu-1", 3, {}, "", "cuda");
  spec.set_devices(5);
  refused = c_->SubmitJob(spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("is 4, all of one device kind (3 workers"));

  // A job that names its device kind is placed on that kind alone.
  spec.set_devices(4);
  spec.set_device("cuda");
  refused = c_->SubmitJob(spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("devices 4 with device cuda: the largest gang this cluster can place is 3 "
                        "of cuda devices (3 workers"));
  spec.set_device("cpu");
  EXPECT_TRUE(c_->SubmitJob(spec, "").ok());
  spec.set_device("auto");

  // A dead worker places nothing: with node-2 gone, the GPUs are the largest gang.
  now_ += kLeaseMs + 1;
  Heartbeat(w1);
  for (const v1::Worker& w : c_->ListWorkers()) {
    if (w.host() == "gpu-1") Heartbeat(w.id());
  }
  c_->ExpireLeases();
  spec.set_devices(4);
  refused = c_->SubmitJob(spec, "");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("is 3, all of one device kind (2 workers"));
}

}  // namespace
}  // namespace ballast::server
