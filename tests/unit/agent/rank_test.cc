#include "worker/agent/rank.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/job_spec.h"
#include "tests/unit/agent/test_coordinator.h"

namespace ballast::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir(const char* name) {
  std::string tmpl = absl::StrCat("/tmp/", name, ".XXXXXX");  // short: socket paths live here
  return mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
}

v1::JobSpec TrickySpec() {
  v1::JobSpec spec;
  spec.set_name("quote \" backslash \\ unicode é ✓ colon: # not a comment");
  spec.mutable_model()->set_path("/models/tiny qwen3");
  spec.set_method("lora");
  spec.mutable_lora()->set_r(16);
  spec.mutable_lora()->set_lora_alpha(32.5);
  spec.mutable_lora()->add_target_modules("q_proj");
  spec.mutable_lora()->add_target_modules("v_proj");
  spec.mutable_data()->set_path("/data/train.jsonl");
  spec.mutable_data()->set_seq_len(2048);
  spec.mutable_data()->set_shuffle(false);  // optional, set to its zero value
  spec.mutable_optimizer()->set_lr(1e-4);
  spec.mutable_optimizer()->set_beta1(0.0);
  spec.mutable_optimizer()->set_max_grad_norm(0.0);
  spec.mutable_schedule()->set_kind("cosine");
  spec.mutable_schedule()->set_warmup_steps(1000000000);  // int64: JSON writes "1000000000"
  spec.set_max_steps(1000000000);
  spec.set_checkpoint_every(5);
  spec.set_seed(18446744073709551615ull);  // uint64 max
  spec.set_gradient_checkpointing(true);
  spec.set_devices(1);
  spec.mutable_scheduling()->set_max_restarts(0);
  spec.mutable_scheduling()->set_priority(-7);
  return spec;
}

TEST(SpecJsonTest, RoundTripsThroughTheTrainersJsonLoader) {
  const std::string dir = TempDir("spec_json_test");
  ASSERT_FALSE(dir.empty());
  const std::string path = dir + "/spec.json";
  const v1::JobSpec spec = TrickySpec();
  ASSERT_TRUE(WriteSpecJson(spec, path).ok());
  absl::StatusOr<v1::JobSpec> loaded = LoadJobSpecFile(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*loaded, spec))
      << loaded->DebugString();
  // Explicit zeros of optional fields survive, so defaults do not replace them.
  EXPECT_TRUE(loaded->data().has_shuffle());
  EXPECT_TRUE(loaded->optimizer().has_beta1());
  EXPECT_TRUE(loaded->scheduling().has_max_restarts());
  fs::remove_all(dir);
}

TEST(TrainArgumentsTest, CarryEverythingTheTrainerNeeds) {
  v1::Assignment a;
  a.set_job_id("job-00000000000a");
  a.set_output_dir("/jobs/job-00000000000a");
  a.set_rank(0);
  a.set_world_size(1);
  a.set_master_addr("10.0.0.1");
  a.set_master_port(29501);
  EXPECT_THAT(TrainArguments(a, "/w/spec.json", "/tmp/s.sock"),
              ElementsAre("--spec", "/w/spec.json", "--out", "/jobs/job-00000000000a",
                          "--agent-socket", "/tmp/s.sock", "--rank", "0", "--world-size", "1",
                          "--master-addr", "10.0.0.1", "--master-port", "29501"));
  a.set_resume_at_or_before(40);
  std::vector<std::string> args = TrainArguments(a, "/w/spec.json", "/tmp/s.sock");
  ASSERT_GE(args.size(), 2u);
  EXPECT_EQ(args[args.size() - 2], "--resume-at-or-before");
  EXPECT_EQ(args.back(), "40");
}

TEST(TrainArgumentsTest, CarryTheAttemptAndTheSilenceLimitForFencing) {
  v1::Assignment a;
  a.set_output_dir("/jobs/j");
  a.set_attempt(7);
  a.set_agent_silence_ms(7500);
  const std::vector<std::string> args = TrainArguments(a, "/w/spec.json", "/tmp/s.sock");
  const auto at = std::find(args.begin(), args.end(), "--attempt");
  ASSERT_NE(at, args.end());
  EXPECT_EQ(*(at + 1), "7");
  const auto silence = std::find(args.begin(), args.end(), "--agent-silence-ms");
  ASSERT_NE(silence, args.end());
  EXPECT_EQ(*(silence + 1), "7500");
}

TEST(TrainArgumentsTest, CarryThePathRootsSoTheRankChecksThePathsAgain) {
  v1::Assignment a;
  a.set_output_dir("/jobs/j");
  a.add_path_roots("/data");
  a.add_path_roots("/models");
  const std::vector<std::string> args = TrainArguments(a, "/w/spec.json", "/tmp/s.sock");
  std::vector<std::string> roots;
  for (auto it = std::find(args.begin(), args.end(), "--path-root"); it != args.end();
       it = std::find(it + 2, args.end(), "--path-root")) {
    ASSERT_NE(it + 1, args.end());
    roots.push_back(*(it + 1));
  }
  EXPECT_THAT(roots, ElementsAre("/data", "/models"));
}

class RankTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("rank_test");
    ASSERT_FALSE(dir_.empty());
    // A stand-in trainer: prints what it was given, and the spec file.
    trainer_ = dir_ + "/fake-train";
    std::ofstream(trainer_) << "#!/bin/sh\n"
                               "echo \"args: $*\"\n"
                               "echo \"CUDA_VISIBLE_DEVICES=[$CUDA_VISIBLE_DEVICES]\"\n"
                               "echo \"OMP_NUM_THREADS=[$OMP_NUM_THREADS]\"\n"
                               "cat \"$2\"\n"
                               "[ \"$FAKE_TRAIN_SLEEP\" = 1 ] && exec sleep 30\n"
                               "exit 3\n";
    chmod(trainer_.c_str(), 0755);
    assignment_.set_action(v1::Assignment::ACTION_START);
    assignment_.set_job_id("job-0000000000ab");
    assignment_.set_attempt(2);
    assignment_.set_rank(0);
    assignment_.set_world_size(1);
    assignment_.set_output_dir(dir_ + "/out");
    *assignment_.mutable_spec() = TrickySpec();
    env_.train_binary = trainer_;
    env_.device_kind = "cpu";
    env_.cpu_threads = 2;
    env_.scratch_dir = dir_ + "/scratch";
    env_.socket_path = dir_ + "/0.sock";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
  std::string trainer_;
  v1::Assignment assignment_;
  RankEnvironment env_;
};

TEST_F(RankTest, ReportsStartedThenExitedWithTheLogTail) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection);
  relay.SetWorkerId("w-1");
  absl::Notification finished;
  absl::StatusOr<std::unique_ptr<Rank>> rank =
      Rank::Start(assignment_, env_, &relay, [&] { finished.Notify(); });
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE((*rank)->Finished());
  ASSERT_TRUE(server.WaitForAccepted(2, absl::Seconds(10)));

  const std::vector<v1::RankEvent> events = server.accepted_events();
  ASSERT_EQ(events.size(), 2u);
  for (const v1::RankEvent& e : events) {
    EXPECT_EQ(e.job_id(), "job-0000000000ab");
    EXPECT_EQ(e.attempt(), 2);
    EXPECT_EQ(e.rank(), 0);
  }
  ASSERT_TRUE(events[0].has_started());
  EXPECT_EQ(events[0].started().pid(), (*rank)->pid());
  ASSERT_TRUE(events[1].has_exited());
  EXPECT_EQ(events[1].exited().exit_code(), 3);
  EXPECT_FALSE(events[1].exited().stopped());
  const std::string& tail = events[1].exited().stderr_tail();
  EXPECT_THAT(tail, HasSubstr("--out " + dir_ + "/out --agent-socket " + dir_ + "/0.sock"));
  EXPECT_THAT(tail, HasSubstr("CUDA_VISIBLE_DEVICES=[]"));
  EXPECT_THAT(tail, HasSubstr("OMP_NUM_THREADS=[2]"));
  EXPECT_THAT(tail, HasSubstr("\"max_steps\":\"1000000000\""));
  EXPECT_TRUE(fs::exists(dir_ + "/out/rank-0.log"));

  rank->reset();
  EXPECT_FALSE(fs::exists(env_.socket_path));
  EXPECT_FALSE(fs::exists(env_.scratch_dir));
}

TEST_F(RankTest, CudaRankSeesOnlyItsDevice) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection);
  relay.SetWorkerId("w-1");
  env_.device_kind = "cuda";
  assignment_.set_device(5);
  absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Start(assignment_, env_, &relay, nullptr);
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE(server.WaitForAccepted(2, absl::Seconds(10)));
  const std::string tail = server.accepted_events()[1].exited().stderr_tail();
  EXPECT_THAT(tail, HasSubstr("CUDA_VISIBLE_DEVICES=[5]"));
}

TEST_F(RankTest, StopEndsTheRankAndMarksItStopped) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection);
  relay.SetWorkerId("w-1");
  setenv("FAKE_TRAIN_SLEEP", "1", 1);
  absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Start(assignment_, env_, &relay, nullptr);
  unsetenv("FAKE_TRAIN_SLEEP");
  ASSERT_TRUE(rank.ok()) << rank.status();
  ASSERT_TRUE(server.WaitForAccepted(1, absl::Seconds(10)));
  EXPECT_FALSE((*rank)->Finished());
  // This trainer never connects to its socket: Stop falls back to SIGTERM.
  (*rank)->Stop(absl::Seconds(5), "test");
  ASSERT_TRUE(server.WaitForAccepted(2, absl::Seconds(10)));
  const v1::RankExited exited = server.accepted_events()[1].exited();
  EXPECT_EQ(exited.exit_code(), 143);
  EXPECT_TRUE(exited.stopped());
}

TEST_F(RankTest, StopAsksOverTheSocketFirstAndKillsOnlyAfterTheGrace) {
  // A trainer that connects, reports what comes down its socket and any
  // SIGTERM, and never exits by itself.
  std::ofstream(trainer_)
      << "#!/usr/bin/env python3\n"
         "import signal, socket, sys, time\n"
         "signal.signal(signal.SIGTERM, lambda *_: print('SIGTERM', flush=True))\n"
         "s = socket.socket(socket.AF_UNIX)\n"
         "s.connect(sys.argv[sys.argv.index('--agent-socket') + 1])\n"
         "print('connected', flush=True)\n"
         "print('control', s.recv(4096), flush=True)\n"
         "time.sleep(60)\n";
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection);
  relay.SetWorkerId("w-1");
  absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Start(assignment_, env_, &relay, nullptr);
  ASSERT_TRUE(rank.ok()) << rank.status();
  const std::string log = assignment_.output_dir() + "/rank-0.log";
  auto log_text = [&] {
    std::ifstream in(log);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (int i = 0; i < 1000 && log_text().find("connected") == std::string::npos; ++i) {
    usleep(10000);
  }
  ASSERT_THAT(log_text(), HasSubstr("connected"));

  const absl::Time t0 = absl::Now();
  (*rank)->Stop(absl::Seconds(1), "cancelled by the test");
  ASSERT_TRUE(server.WaitForAccepted(2, absl::Seconds(10)));
  const absl::Duration took = absl::Now() - t0;
  const v1::RankExited exited = server.accepted_events()[1].exited();
  EXPECT_EQ(exited.exit_code(), 128 + SIGKILL) << log_text();
  EXPECT_TRUE(exited.stopped());
  EXPECT_GE(took, absl::Milliseconds(900)) << "killed before the grace ran out";
  EXPECT_THAT(log_text(), HasSubstr("cancelled by the test"));
  EXPECT_THAT(log_text(), ::testing::Not(HasSubstr("SIGTERM")));
}

TEST_F(RankTest, MissingTrainerFailsToStartAndQueuesNothing) {
  TestCoordinator server;
  CoordinatorConnection connection(server.address(), "", grpc::InsecureChannelCredentials());
  EventRelay relay(&connection);
  env_.train_binary = dir_ + "/nothing-here";
  absl::StatusOr<std::unique_ptr<Rank>> rank = Rank::Start(assignment_, env_, &relay, nullptr);
  EXPECT_EQ(rank.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(relay.Unacknowledged(), 0u);
}

}  // namespace
}  // namespace ballast::agent

namespace ballast::agent {
namespace {

TEST(StopOrphanedRanksTest, KillsRanksOfAPreviousRunAndSparesStrangers) {
  const std::string dir = TempDir("orphans_test");
  ASSERT_FALSE(dir.empty());
  const fs::path orphan_dir = fs::path(dir) / "job-1-a1-r0";
  const fs::path stranger_dir = fs::path(dir) / "job-2-a1-r0";
  fs::create_directories(orphan_dir);
  fs::create_directories(stranger_dir);
  SpawnOptions o;
  o.binary = "/bin/sh";
  // Names its spec on the command line, as ballast-train --spec does.
  o.args = {"-c", "sleep 30; : " + (orphan_dir / "spec.json").string()};
  o.log_path = dir + "/orphan.log";
  absl::StatusOr<std::unique_ptr<RankProcess>> orphan = RankProcess::Spawn(o);
  ASSERT_TRUE(orphan.ok());
  std::ofstream(orphan_dir / "pid") << (*orphan)->pid() << "\n";
  // A pid file naming a live process that is not that rank (pid reuse).
  std::ofstream(stranger_dir / "pid") << getpid() << "\n";

  // Right after exec the kernel may still show an empty command line; an
  // orphan from an earlier worker run is long past that.
  bool named = false;
  for (int i = 0; i < 500 && !named; ++i) {
    std::ifstream c(absl::StrCat("/proc/", (*orphan)->pid(), "/cmdline"));
    named = std::string((std::istreambuf_iterator<char>(c)), std::istreambuf_iterator<char>())
                .find("spec.json") != std::string::npos;
    if (!named) usleep(10000);
  }
  ASSERT_TRUE(named);
  EXPECT_EQ(StopOrphanedRanks(dir), 1);
  std::optional<ProcessExit> exit = (*orphan)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 128 + SIGKILL);
  EXPECT_FALSE(fs::exists(orphan_dir));
  EXPECT_FALSE(fs::exists(stranger_dir));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ballast::agent
