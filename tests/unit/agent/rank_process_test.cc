#include "worker/agent/rank_process.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ballast::agent {
namespace {

namespace fs = std::filesystem;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

class RankProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "rank_process_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    log_ = (fs::path(dir_) / "rank-0.log").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  SpawnOptions Shell(const std::string& script) {
    SpawnOptions o;
    o.binary = "/bin/sh";
    o.args = {"-c", script};
    o.log_path = log_;
    return o;
  }

  std::string ReadLog() {
    std::ifstream in(log_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  // Polls the log until it holds `text`: the child has got that far.
  bool WaitForLog(const std::string& text) {
    for (int i = 0; i < 500; ++i) {
      if (ReadLog().find(text) != std::string::npos) return true;
      usleep(10000);
    }
    return false;
  }

  std::string dir_;
  std::string log_;
};

TEST_F(RankProcessTest, ReportsExitCodeAndAppendsStdoutAndStderrToTheLog) {
  absl::StatusOr<std::unique_ptr<RankProcess>> p =
      RankProcess::Spawn(Shell("echo to-stdout; echo to-stderr >&2; exit 7"));
  ASSERT_TRUE(p.ok()) << p.status();
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 7);
  EXPECT_FALSE(exit->stopped);
  EXPECT_EQ(exit->log_tail, "to-stdout\nto-stderr\n");
  EXPECT_EQ(ReadLog(), "to-stdout\nto-stderr\n");
  EXPECT_TRUE((*p)->Exited());
}

TEST_F(RankProcessTest, CallsOnExitOnceWithTheExit) {
  absl::Mutex mu;
  std::vector<int> codes;
  SpawnOptions o = Shell("exit 3");
  o.on_exit = [&](const ProcessExit& e) {
    absl::MutexLock lock(&mu);
    codes.push_back(e.exit_code);
  };
  {
    absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(std::move(o));
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->WaitForExit(absl::Seconds(10)).has_value());
  }
  absl::MutexLock lock(&mu);
  EXPECT_EQ(codes, std::vector<int>{3});
}

TEST_F(RankProcessTest, KilledBySignalReports128PlusTheSignal) {
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(Shell("kill -KILL $$"));
  ASSERT_TRUE(p.ok());
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 128 + SIGKILL);
  EXPECT_FALSE(exit->stopped);
}

TEST_F(RankProcessTest, StopSendsSigtermEvenWhenTheWorkerBlocksIt) {
  // The worker blocks SIGTERM in every thread to sigwait for it; a rank
  // must not inherit that mask.
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  absl::StatusOr<std::unique_ptr<RankProcess>> p =
      RankProcess::Spawn(Shell("echo ready; exec sleep 30"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(WaitForLog("ready"));
  const absl::Time t0 = absl::Now();
  (*p)->Stop(absl::Seconds(20));
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 128 + SIGTERM);
  EXPECT_TRUE(exit->stopped);
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));  // SIGTERM, not the SIGKILL 20 s later
}

TEST_F(RankProcessTest, StopEscalatesToSigkillAfterTheGraceWhenTermIsIgnored) {
  absl::StatusOr<std::unique_ptr<RankProcess>> p =
      RankProcess::Spawn(Shell("trap '' TERM; echo ready; while true; do sleep 0.05; done"));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(WaitForLog("ready"));
  const absl::Time t0 = absl::Now();
  (*p)->Stop(absl::Milliseconds(300));
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 128 + SIGKILL);
  EXPECT_TRUE(exit->stopped);
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(300));
}

TEST_F(RankProcessTest, StopReachesTheWholeProcessGroup) {
  // The shell waits on a background child; both must go.
  const std::string pid_file = (fs::path(dir_) / "child.pid").string();
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(
      Shell(absl::StrCat("sleep 30 & echo $! > ", pid_file, "; echo ready; wait")));
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(WaitForLog("ready"));
  pid_t child = 0;
  std::ifstream(pid_file) >> child;
  ASSERT_GT(child, 0);
  (*p)->Stop(absl::Seconds(5));
  ASSERT_TRUE((*p)->WaitForExit(absl::Seconds(10)).has_value());
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = kill(child, 0) != 0;  // the test reaps nothing; init reaps the orphan
    if (!gone) usleep(10000);
  }
  EXPECT_TRUE(gone) << "background child " << child << " survived";
}

TEST_F(RankProcessTest, TailIsTheLast4KiBOfThisRunInWholeLines) {
  { std::ofstream(log_) << "earlier attempt\n"; }
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(
      Shell("i=0; while [ $i -lt 400 ]; do echo line-$i-padding-padding; i=$((i+1)); done; "
            "printf 'bad byte \\377 end\\n'; echo last line >&2; exit 1"));
  ASSERT_TRUE(p.ok());
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_LE(exit->log_tail.size(), RankProcess::kLogTailBytes);
  EXPECT_GT(exit->log_tail.size(), 3000u);
  EXPECT_THAT(exit->log_tail, ::testing::StartsWith("line-"));
  EXPECT_THAT(exit->log_tail, HasSubstr("bad byte ? end\n"));  // valid UTF-8 for the proto
  EXPECT_THAT(exit->log_tail, EndsWith("last line\n"));
  EXPECT_THAT(exit->log_tail, Not(HasSubstr("earlier attempt")));
  EXPECT_THAT(ReadLog(), ::testing::StartsWith("earlier attempt\nline-0-"));
}

TEST_F(RankProcessTest, SetsEnvironmentAndLeaksNoDescriptors) {
  const int leaked = open("/dev/null", O_RDONLY);  // no O_CLOEXEC on purpose
  ASSERT_GE(leaked, 3);
  SpawnOptions o = Shell(absl::StrCat("echo X=$BALLAST_TEST_X; echo PATH=${PATH:+set}; ",
                                      "if [ -e /proc/$$/fd/", leaked,
                                      " ]; then echo leaked; else echo clean; fi; "
                                      "read line; echo stdin=[$line]"));
  o.env = {{"BALLAST_TEST_X", "42"}};
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(std::move(o));
  close(leaked);
  ASSERT_TRUE(p.ok());
  std::optional<ProcessExit> exit = (*p)->WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->log_tail, "X=42\nPATH=set\nclean\nstdin=[]\n");
}

TEST_F(RankProcessTest, MissingBinaryIsNotFound) {
  SpawnOptions o = Shell("");
  o.binary = (fs::path(dir_) / "no-such-binary").string();
  absl::StatusOr<std::unique_ptr<RankProcess>> p = RankProcess::Spawn(std::move(o));
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("no-such-binary"));
}

TEST(SanitizeUtf8Test, KeepsValidTextAndReplacesInvalidBytes) {
  EXPECT_EQ(SanitizeUtf8("plain é ✓ 😀"), "plain é ✓ 😀");
  EXPECT_EQ(SanitizeUtf8("a\xff"
                         "b"),
            "a?b");
  EXPECT_EQ(SanitizeUtf8("\xc0\xaf"), "??");       // overlong '/'
  EXPECT_EQ(SanitizeUtf8("\xed\xa0\x80"), "???");  // a surrogate
  EXPECT_EQ(SanitizeUtf8("cut \xe2\x9c"), "cut ??");
}

}  // namespace
}  // namespace ballast::agent
