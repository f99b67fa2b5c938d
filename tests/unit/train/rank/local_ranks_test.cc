#include "worker/train/rank/local_ranks.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// Ranks are /bin/sh scripts: the launcher's arguments come after the script
// as $1.., so $2 is the rank, $4 the world size, $6 the address, $8 the port.
class LocalRanksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ballast-local-ranks-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    err_path_ = dir_ / "stderr";
    err_fd_ = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(err_fd_, 0);
  }
  void TearDown() override {
    close(err_fd_);
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  LocalRanksOptions Script(const std::string& script, int nproc) {
    LocalRanksOptions o;
    o.binary = "/bin/sh";
    o.args = {"-c", script, "rank"};
    o.nproc = nproc;
    o.grace = std::chrono::milliseconds(300);
    o.err_fd = err_fd_;
    return o;
  }

  std::string Read(const fs::path& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::string Stderr() { return Read(err_path_); }

  fs::path dir_;
  fs::path err_path_;
  int err_fd_ = -1;
};

TEST_F(LocalRanksTest, EveryRankGetsItsRankTheWorldSizeAndOneRendezvous) {
  absl::StatusOr<int> code =
      RunLocalRanks(Script("echo \"$2 $4 $6 $8\" > " + dir_.string() + "/rank-$2", 3));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::istringstream line(Read(dir_ / ("rank-" + std::to_string(r))));
    std::string rank, world, addr, p;
    line >> rank >> world >> addr >> p;
    EXPECT_EQ(rank, std::to_string(r));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(p), 0);
    if (r > 0) EXPECT_EQ(p, port) << "every rank meets at the same port";
    port = p;
  }
}

TEST_F(LocalRanksTest, AFailingRankEndsTheOthersAtOnceAndItsCodeIsTheLaunchers) {
  const auto start = Clock::now();
  absl::StatusOr<int> code = RunLocalRanks(Script("[ $2 = 1 ] && exit 7; exec sleep 60", 3));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 7);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "the sleeping ranks were ended";
  EXPECT_THAT(Stderr(), HasSubstr("ballast-train: rank 1 of 3 exited with code 7; stopping the "
                                  "other ranks\n"));
}

TEST_F(LocalRanksTest, ARankThatIgnoresSigtermIsKilledAfterTheGrace) {
  const auto start = Clock::now();
  absl::StatusOr<int> code = RunLocalRanks(Script(
      "[ $2 = 1 ] && { sleep 0.2; exit 3; }; trap '' TERM; while :; do sleep 0.05; done", 2));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 3);
  const auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(500)) << "0.2 s to fail, then the 0.3 s grace";
  EXPECT_LT(took, std::chrono::seconds(5));
}

TEST_F(LocalRanksTest, ARankKilledByASignalGivesTheShellsCodeAndNamesTheSignal) {
  absl::StatusOr<int> code = RunLocalRanks(Script("[ $2 = 0 ] && kill -9 $$; sleep 60", 2));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 128 + 9);
  EXPECT_THAT(Stderr(), HasSubstr("rank 0 of 2 was killed by signal 9"));
}

TEST_F(LocalRanksTest, StderrLinesArePrefixedWithTheirRank) {
  absl::StatusOr<int> code = RunLocalRanks(Script("printf 'one\\ntwo' >&2", 2));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  const std::string err = Stderr();
  for (const char* line :
       {"[rank 0] one\n", "[rank 0] two\n", "[rank 1] one\n", "[rank 1] two\n"}) {
    EXPECT_THAT(err, HasSubstr(line));
  }
}

TEST_F(LocalRanksTest, AProgramThatCannotRunFailsWith127) {
  LocalRanksOptions o = Script("", 2);
  o.binary = (dir_ / "missing").string();
  absl::StatusOr<int> code = RunLocalRanks(o);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 127);
  EXPECT_THAT(Stderr(), HasSubstr("cannot run"));
}

TEST_F(LocalRanksTest, SigtermToTheLauncherReachesEveryRank) {
  const std::string script = "trap 'echo stopped >&2; exit 143' TERM; : > " + dir_.string() +
                             "/ready-$2; while :; do sleep 0.05; done";
  const LocalRanksOptions options = Script(script, 2);
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    absl::StatusOr<int> code = RunLocalRanks(options);
    _exit(code.ok() ? *code : 99);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (!(fs::exists(dir_ / "ready-0") && fs::exists(dir_ / "ready-1")) &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 143);
  EXPECT_THAT(Stderr(), HasSubstr("[rank 0] stopped\n"));
  EXPECT_THAT(Stderr(), HasSubstr("[rank 1] stopped\n"));
}

TEST(LocalRanksArguments, DropTheOptionAndItsValueInBothSpellings) {
  const char* argv[] = {"ballast-train", "--spec", "a.yaml",    "--nproc", "2",
                        "--out",         "o",      "--nproc=3", "--set",   "x=1"};
  EXPECT_THAT(ArgumentsWithout(10, argv, "--nproc"),
              ::testing::ElementsAre("--spec", "a.yaml", "--out", "o", "--set", "x=1"));
}

}  // namespace
}  // namespace ballast::train
