#include "worker/train/rank/agent_channel.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

using Clock = std::chrono::steady_clock;

// How often the reader wakes without traffic: bounds how late a silence is
// noticed (at most a quarter of the limit) and how long the destructor waits.
std::chrono::milliseconds PollPeriod(std::chrono::milliseconds limit) {
  constexpr std::chrono::milliseconds kMax{100};
  if (limit.count() <= 0) return kMax;
  return std::clamp(limit / 4, std::chrono::milliseconds{1}, kMax);
}

}  // namespace

absl::StatusOr<std::unique_ptr<AgentChannel>> AgentChannel::Connect(const std::string& path,
                                                                    int rank, SilenceFence fence,
                                                                    PhaseSource phases) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--agent-socket '", path, "' has ", path.size(),
                                                   " bytes; allowed: 1..",
                                                   sizeof(addr.sun_path) - 1));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the worker at ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<AgentChannel>(
      new AgentChannel(fd, rank, std::move(fence), std::move(phases)));
}

AgentChannel::AgentChannel(int fd, int rank, SilenceFence fence, PhaseSource phases)
    : fd_(fd), rank_(rank), fence_(std::move(fence)), phases_(std::move(phases)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

AgentChannel::~AgentChannel() {
  closing_.store(true);
  reader_.join();
  close(fd_);
}

absl::Status AgentChannel::Send(const v1::RankMessage& message) {
  absl::MutexLock lock(&send_mu_);
  if (broken_) return absl::UnavailableError("the worker's socket is closed");
  std::string wire;
  {
    google::protobuf::io::StringOutputStream out(&wire);
    if (!google::protobuf::util::SerializeDelimitedToZeroCopyStream(message, &out)) {
      return absl::InternalError("cannot serialise RankMessage");
    }
  }
  size_t sent = 0;
  while (sent < wire.size()) {
    // MSG_NOSIGNAL: a dead worker gives EPIPE here, not a SIGPIPE that would
    // kill the rank mid-training.
    const ssize_t n = send(fd_, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      return absl::UnavailableError(
          absl::StrCat("cannot write to the worker's socket: ", std::strerror(errno)));
    }
    sent += n;
  }
  return absl::OkStatus();
}

void AgentChannel::ReadLoop() {
  const std::chrono::milliseconds period = PollPeriod(fence_.limit);
  Clock::time_point last_keepalive = Clock::now();
  RankFrameReader frames;  // a message may arrive in pieces
  bool open = true;
  while (!closing_.load()) {
    // A closed socket polls readable forever; once the worker is gone only
    // the silence clock is left to watch.
    pollfd p{fd_, POLLIN, 0};
    const int ready = poll(&p, open ? 1 : 0, static_cast<int>(period.count()));
    if (ready > 0) {
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        frames.Append(absl::string_view(buf, static_cast<size_t>(n)));
        // A stream that cannot be delimited any more is as good as gone.
        open = TakeControl(&frames, &last_keepalive);
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        open = false;  // the worker is gone: no keepalive will come
      }
    }
    if (phases_.read) ReportHeldPhase();
    const auto silent =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_keepalive);
    if (fence_.limit.count() > 0 && silent > fence_.limit) {
      if (fence_.on_silent) fence_.on_silent(silent);
      return;
    }
  }
}

bool AgentChannel::TakeControl(RankFrameReader* frames, Clock::time_point* last_keepalive) {
  while (true) {
    const absl::StatusOr<std::optional<absl::string_view>> frame = frames->Next();
    if (!frame.ok()) return false;
    if (!frame->has_value()) return true;
    // A frame that is not a RankControl is skipped; its length still holds.
    v1::RankControl control;
    if (control.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size()))) {
      if (control.has_cancel()) cancelled_.store(true);
      if (control.has_keepalive()) *last_keepalive = Clock::now();
    }
  }
}

void AgentChannel::ReportHeldPhase() {
  std::optional<std::pair<uint64_t, v1::RankPhase>> now = phases_.read();
  if (!now.has_value()) return;
  if (now->first != phase_seen_) {
    phase_seen_ = now->first;
    phase_seen_at_ = Clock::now();
    phase_sent_ = false;
    return;
  }
  if (phase_sent_ || Clock::now() - phase_seen_at_ < phases_.hold) return;
  phase_sent_ = true;
  v1::RankMessage m;
  *m.mutable_training()->mutable_phase() = std::move(now->second);
  m.mutable_training()->mutable_phase()->set_rank(rank_);
  (void)Send(m);  // the next held phase says it again
}

void AgentChannel::OnEvent(const v1::TrainingEvent& event) {
  v1::RankMessage m;
  *m.mutable_training() = event;
  if (m.training().has_log()) {
    v1::LogLine* log = m.mutable_training()->mutable_log();
    log->set_rank(rank_);
    const std::string& text = log->text();
    if (text.size() > kMaxLogLineBytes) {
      size_t keep = kMaxLogLineBytes;
      // Back to the first byte of a UTF-8 character, so the cut stays UTF-8.
      while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xc0) == 0x80) --keep;
      log->set_text(absl::StrCat(absl::string_view(text).substr(0, keep), " ... [",
                                 text.size() - keep, " more bytes cut]"));
    }
  }
  (void)Send(m);  // A lost report is fine: metrics.jsonl has every step.
}

}  // namespace ballast::train
