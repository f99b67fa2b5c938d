// Both ends of the rank channel over a real Unix socket: the worker's
// RankSocket and the trainer's AgentChannel.
#include "worker/agent/rank_socket.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "worker/train/rank/agent_channel.h"

namespace ballast::agent {
namespace {

namespace fs = std::filesystem;
using train::AgentChannel;

v1::TrainingEvent Step(const v1::StepMetrics& metrics) {
  v1::TrainingEvent event;
  *event.mutable_step_metrics() = metrics;
  return event;
}

class RankSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Short on purpose: sun_path holds 108 bytes and TempDir may be deep.
    char tmpl[] = "/tmp/rank_socket_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/0.sock";
  }
  void TearDown() override { fs::remove_all(dir_); }

  RankSocket::MessageCallback Collect() {
    return [this](const v1::RankMessage& m) {
      absl::MutexLock lock(&mu_);
      got_.push_back(m);
    };
  }
  bool WaitForMessages(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }

  std::string dir_;
  std::string path_;
  absl::Mutex mu_;
  std::vector<v1::RankMessage> got_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RankSocketTest, ALogLinePastTheLimitIsCutAtACharacterAndSaysSo) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok()) << socket.status();
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 0);
  ASSERT_TRUE(channel.ok()) << channel.status();
  // 'x' then two-byte characters: the limit falls inside one of them.
  std::string text = "x";
  while (text.size() < 1 << 20) text += "\xce\xb1";
  (*channel)->OnEvent(train::LogEvent("error", text));
  ASSERT_TRUE(WaitForMessages(1));
  absl::MutexLock lock(&mu_);
  const std::string& got = got_[0].training().log().text();
  EXPECT_LE(got.size(), train::kMaxLogLineBytes + 64);
  EXPECT_EQ(got.substr(0, 3), "x\xce\xb1");
  const std::string tail =
      absl::StrCat(" ... [", text.size() - train::kMaxLogLineBytes + 1, " more bytes cut]");
  EXPECT_EQ(got.substr(got.size() - tail.size()), tail);
  EXPECT_EQ(got.substr(got.size() - tail.size() - 2, 2), "\xce\xb1");
}

TEST_F(RankSocketTest, RankMessagesGoUpInOrderAndCancelComesDown) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok()) << socket.status();
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 3);
  ASSERT_TRUE(channel.ok()) << channel.status();

  for (int step = 1; step <= 200; ++step) {
    v1::StepMetrics m;
    m.set_step(step);
    m.set_max_steps(200);
    m.set_loss(1.0 / step);
    m.set_tokens_per_s(1000.5);
    (*channel)->OnEvent(Step(m));
  }
  v1::CheckpointSaved saved;
  saved.set_step(200);
  saved.set_path("/out/checkpoints/step-00000200");
  v1::TrainingEvent saved_event;
  *saved_event.mutable_checkpoint_saved() = saved;
  (*channel)->OnEvent(saved_event);
  v1::GuardEvent guard;
  guard.set_kind(v1::GuardEvent::KIND_SKIP);
  guard.set_step(7);
  v1::TrainingEvent guard_event;
  *guard_event.mutable_guard() = guard;
  (*channel)->OnEvent(guard_event);
  (*channel)->OnEvent(train::LogEvent("info", "resuming from checkpoint step 5 ✓"));
  ASSERT_TRUE(WaitForMessages(203));
  {
    absl::MutexLock lock(&mu_);
    ASSERT_EQ(got_.size(), 203u);
    for (int i = 0; i < 200; ++i) {
      ASSERT_TRUE(got_[i].training().has_step_metrics());
      EXPECT_EQ(got_[i].training().step_metrics().step(), i + 1);
      EXPECT_EQ(got_[i].training().step_metrics().max_steps(), 200);
      EXPECT_DOUBLE_EQ(got_[i].training().step_metrics().loss(), 1.0 / (i + 1));
    }
    EXPECT_EQ(got_[200].training().checkpoint_saved().path(), "/out/checkpoints/step-00000200");
    EXPECT_EQ(got_[201].training().guard().kind(), v1::GuardEvent::KIND_SKIP);
    EXPECT_EQ(got_[202].training().log().rank(), 3);
    EXPECT_EQ(got_[202].training().log().level(), "info");
    EXPECT_EQ(got_[202].training().log().text(), "resuming from checkpoint step 5 ✓");
  }

  EXPECT_FALSE((*channel)->CancelRequested());
  EXPECT_FALSE((*channel)->StopRequested());
  v1::RankControl control;
  control.mutable_cancel()->set_reason("cancelled by the user");
  ASSERT_TRUE((*socket)->Send(control).ok());
  bool cancelled = false;
  for (int i = 0; i < 500 && !cancelled; ++i) {
    cancelled = (*channel)->CancelRequested();
    if (!cancelled) usleep(10000);
  }
  EXPECT_TRUE(cancelled);
  EXPECT_TRUE((*channel)->StopRequested());  // and it stays so

  // The rank leaves: Drain returns as soon as the reader has seen EOF.
  channel->reset();
  const absl::Time t0 = absl::Now();
  (*socket)->Drain(absl::Seconds(10));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(5));
}

// The phase goes up only once it has held: a rank that moves through its
// phases faster than the hold sends none, and a rank that stays in one sends
// it once, from the channel's thread, while the training thread does nothing.
TEST_F(RankSocketTest, APhaseGoesUpOnceItHasHeldAndAMovingOneNever) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok()) << socket.status();
  absl::Mutex phase_mu;
  uint64_t version = 1;
  v1::RankPhase phase;
  phase.set_step(7);
  phase.set_phase("collective");
  phase.set_collective("all_gather");
  phase.set_layer(3);
  phase.set_collective_seq(1);
  train::PhaseSource source;
  source.hold = std::chrono::milliseconds(300);
  source.read = [&]() -> std::optional<std::pair<uint64_t, v1::RankPhase>> {
    absl::MutexLock lock(&phase_mu);
    return std::make_pair(version, phase);
  };
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel =
      AgentChannel::Connect(path_, 2, {}, source);
  ASSERT_TRUE(channel.ok()) << channel.status();
  // Moving every 20 ms for 1 s: nothing held for 300 ms.
  for (int i = 0; i < 50; ++i) {
    {
      absl::MutexLock lock(&phase_mu);
      ++version;
      phase.set_collective_seq(version);
    }
    usleep(20000);
  }
  {
    absl::MutexLock lock(&mu_);
    EXPECT_TRUE(got_.empty()) << got_.size() << " phases of a rank that kept moving";
  }
  // Then held: one report, with this rank and the phase as it stood.
  ASSERT_TRUE(WaitForMessages(1));
  usleep(600000);  // twice the hold again: still one
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(got_.size(), 1u);
  const v1::RankPhase& sent = got_[0].training().phase();
  EXPECT_EQ(sent.rank(), 2);
  EXPECT_EQ(sent.step(), 7);
  EXPECT_EQ(sent.collective(), "all_gather");
  EXPECT_EQ(sent.collective_seq(), 51);
  EXPECT_EQ(sent.layer(), 3);
}

TEST_F(RankSocketTest, SendBeforeTheRankConnectsIsFailedPrecondition) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  v1::RankControl control;
  control.mutable_cancel();
  EXPECT_EQ((*socket)->Send(control).code(), absl::StatusCode::kFailedPrecondition);
  // Nobody connected: Drain does not wait.
  const absl::Time t0 = absl::Now();
  (*socket)->Drain(absl::Seconds(10));
  EXPECT_LT(absl::Now() - t0, absl::Seconds(2));
}

TEST_F(RankSocketTest, MessagesOfARankThatExitedAtOnceStillArrive) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  {
    absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 0);
    ASSERT_TRUE(channel.ok());
    (*channel)->OnEvent(train::LogEvent("error", "dying"));
  }
  (*socket)->Drain(absl::Seconds(5));
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(got_.size(), 1u);
  EXPECT_EQ(got_[0].training().log().text(), "dying");
}

TEST_F(RankSocketTest, AStepWithoutLossArrivesWithoutOne) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 0);
  ASSERT_TRUE(channel.ok());
  v1::StepMetrics m;
  m.set_step(1);
  (*channel)->OnEvent(Step(m));
  m.set_step(2);
  m.set_loss(0.0);  // a real loss of 0 is a loss
  (*channel)->OnEvent(Step(m));
  ASSERT_TRUE(WaitForMessages(2));
  absl::MutexLock lock(&mu_);
  EXPECT_FALSE(got_[0].training().step_metrics().has_loss());
  EXPECT_TRUE(got_[1].training().step_metrics().has_loss());
}

TEST_F(RankSocketTest, WritingToAGoneWorkerFailsWithoutSigpipe) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 0);
  ASSERT_TRUE(channel.ok());
  v1::RankMessage m;
  m.mutable_training()->mutable_log()->set_text("hello");
  ASSERT_TRUE((*channel)->Send(m).ok());
  ASSERT_TRUE(WaitForMessages(1));
  socket->reset();  // the worker dies
  EXPECT_FALSE(fs::exists(path_));

  // The test process has SIGPIPE's default action: a plain write() would kill it here.
  absl::Status last;
  for (int i = 0; i < 100; ++i) last = (*channel)->Send(m);
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable);
  (*channel)->OnEvent(Step(v1::StepMetrics()));  // reports keep being accepted and dropped
  EXPECT_FALSE((*channel)->CancelRequested());
}

TEST_F(RankSocketTest, ControlMessageArrivingInPiecesIsParsedWhenComplete) {
  // A raw worker end, to split one delimited message across two writes.
  const int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(listener, 1), 0);
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel = AgentChannel::Connect(path_, 0);
  ASSERT_TRUE(channel.ok());
  const int conn = accept(listener, nullptr, nullptr);
  ASSERT_GE(conn, 0);

  v1::RankControl control;
  control.mutable_cancel()->set_reason(std::string(300, 'x'));  // a two-byte length
  const std::string body = control.SerializeAsString();
  std::string wire;
  wire.push_back(static_cast<char>((body.size() & 0x7f) | 0x80));
  wire.push_back(static_cast<char>(body.size() >> 7));
  wire += body;
  ASSERT_EQ(write(conn, wire.data(), 1), 1);  // half of the length
  usleep(20000);
  EXPECT_FALSE((*channel)->CancelRequested());
  ASSERT_EQ(write(conn, wire.data() + 1, 100), 100);
  usleep(20000);
  EXPECT_FALSE((*channel)->CancelRequested());
  ASSERT_EQ(write(conn, wire.data() + 101, wire.size() - 101),
            static_cast<ssize_t>(wire.size() - 101));
  usleep(20000);
  EXPECT_TRUE((*channel)->CancelRequested());
  close(conn);
  close(listener);
}

// Connects a channel that fences itself after `limit` of silence and
// records when it did.
class FenceRecorder {
 public:
  train::SilenceFence Fence(std::chrono::milliseconds limit) {
    train::SilenceFence fence;
    fence.limit = limit;
    fence.on_silent = [this](std::chrono::milliseconds silent) {
      absl::MutexLock lock(&mu_);
      silent_ = silent;
      at_ = absl::Now();
    };
    return fence;
  }
  bool Fenced() {
    absl::MutexLock lock(&mu_);
    return at_.has_value();
  }
  // Waits up to `timeout` for the fence; when it fell, or nullopt.
  std::optional<absl::Time> WaitFenced(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto fenced = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return at_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&fenced), timeout);
    return at_;
  }
  std::chrono::milliseconds silent() {
    absl::MutexLock lock(&mu_);
    return silent_;
  }

 private:
  absl::Mutex mu_;
  std::optional<absl::Time> at_ ABSL_GUARDED_BY(mu_);
  std::chrono::milliseconds silent_ ABSL_GUARDED_BY(mu_){0};
};

TEST_F(RankSocketTest, KeepalivesHoldTheFenceOffAndItFallsSoonAfterTheyStop) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  FenceRecorder recorder;
  constexpr std::chrono::milliseconds kLimit{300};
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel =
      AgentChannel::Connect(path_, 0, recorder.Fence(kLimit));
  ASSERT_TRUE(channel.ok());
  v1::RankControl keepalive;
  keepalive.mutable_keepalive();
  // Four limits' worth of keepalives, each well within the limit.
  absl::Time last_sent;
  for (int i = 0; i < 24; ++i) {
    absl::Status s = (*socket)->Send(keepalive);
    // The rank may not be accepted yet on the first tries.
    if (s.ok()) last_sent = absl::Now();
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(recorder.Fenced()) << "fenced while keepalives arrived";
  EXPECT_FALSE((*channel)->CancelRequested()) << "a keepalive is not a cancel";

  const std::optional<absl::Time> fenced = recorder.WaitFenced(absl::Seconds(5));
  ASSERT_TRUE(fenced.has_value());
  // Not before the limit, and late by at most a poll period (a quarter of it)
  // plus scheduling noise.
  EXPECT_GE(*fenced - last_sent, absl::FromChrono(kLimit));
  EXPECT_LT(*fenced - last_sent, absl::FromChrono(kLimit) + absl::Milliseconds(500));
  EXPECT_GT(recorder.silent(), kLimit);
}

TEST_F(RankSocketTest, AWorkerThatIsGoneFencesTheRankAfterTheLimit) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  FenceRecorder recorder;
  const absl::Time connected = absl::Now();
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel =
      AgentChannel::Connect(path_, 0, recorder.Fence(std::chrono::milliseconds(200)));
  ASSERT_TRUE(channel.ok());
  socket->reset();  // the worker dies without a word
  const std::optional<absl::Time> fenced = recorder.WaitFenced(absl::Seconds(5));
  ASSERT_TRUE(fenced.has_value());
  EXPECT_GE(*fenced - connected, absl::Milliseconds(200));
}

TEST_F(RankSocketTest, WithoutALimitARankNeverFences) {
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(path_, Collect());
  ASSERT_TRUE(socket.ok());
  FenceRecorder recorder;
  absl::StatusOr<std::unique_ptr<AgentChannel>> channel =
      AgentChannel::Connect(path_, 0, recorder.Fence(std::chrono::milliseconds(0)));
  ASSERT_TRUE(channel.ok());
  socket->reset();
  EXPECT_FALSE(recorder.WaitFenced(absl::Milliseconds(500)).has_value());
  // The channel still closes promptly: its reader wakes to notice.
  const absl::Time t0 = absl::Now();
  channel->reset();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(1));
}

TEST_F(RankSocketTest, RejectsAPathLongerThanSunPath) {
  const std::string long_path = "/tmp/" + std::string(120, 'p') + ".sock";
  absl::StatusOr<std::unique_ptr<RankSocket>> socket = RankSocket::Listen(long_path, Collect());
  EXPECT_EQ(socket.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AgentChannel::Connect(long_path, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RankSocketTest, ConnectWithoutAWorkerIsUnavailable) {
  EXPECT_EQ(AgentChannel::Connect(path_, 0).status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ballast::agent
