#include "worker/train/agent_channel.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ballast::train {

absl::StatusOr<std::unique_ptr<AgentChannel>> AgentChannel::Connect(const std::string& path,
                                                                    int rank) {
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
  return std::unique_ptr<AgentChannel>(new AgentChannel(fd, rank));
}

AgentChannel::~AgentChannel() { close(fd_); }

absl::Status AgentChannel::Send(const v1::RankMessage& message) {
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

bool AgentChannel::CancelRequested() {
  char buf[4096];
  for (;;) {
    const ssize_t n = recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      pending_.append(buf, n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: nothing more now; 0 or an error: the worker is gone.
  }
  // Parses every complete delimited message; a partial one waits for more.
  while (!pending_.empty()) {
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(pending_.data()),
                                              static_cast<int>(pending_.size()));
    uint32_t size = 0;
    if (!in.ReadVarint32(&size)) break;
    const size_t header = in.CurrentPosition();
    if (pending_.size() - header < size) break;
    v1::RankControl control;
    if (control.ParseFromArray(pending_.data() + header, static_cast<int>(size)) &&
        control.has_cancel()) {
      cancelled_ = true;
    }
    pending_.erase(0, header + size);
  }
  return cancelled_;
}

void AgentChannel::OnStep(const v1::StepMetrics& metrics) {
  v1::RankMessage m;
  *m.mutable_training()->mutable_step_metrics() = metrics;
  (void)Send(m);  // A lost report is fine: metrics.jsonl has it.
}

void AgentChannel::OnGuard(const v1::GuardEvent& event) {
  v1::RankMessage m;
  *m.mutable_training()->mutable_guard() = event;
  (void)Send(m);
}

void AgentChannel::OnCheckpointSaved(const v1::CheckpointSaved& saved) {
  v1::RankMessage m;
  *m.mutable_training()->mutable_checkpoint_saved() = saved;
  (void)Send(m);
}

void AgentChannel::OnLog(const std::string& level, const std::string& text) {
  v1::RankMessage m;
  v1::LogLine* log = m.mutable_training()->mutable_log();
  log->set_rank(rank_);
  log->set_level(level);
  log->set_text(text);
  (void)Send(m);
}

}  // namespace ballast::train
