#include "worker/agent/rank_socket.h"

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/delimited_message_util.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/rank_frames.h"

namespace ballast::agent {

absl::StatusOr<std::unique_ptr<RankSocket>> RankSocket::Listen(const std::string& path,
                                                               MessageCallback on_message) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() > kMaxPathBytes) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", path, "' has ", path.size(),
                                                   " bytes; allowed: 1..", kMaxPathBytes));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Non-blocking, so that the reader can accept while holding the lock (see
  // ReadLoop); accepted connections are blocking again.
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  unlink(path.c_str());
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 4) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("cannot listen on ", path, ": ", std::strerror(err)));
  }
  return std::unique_ptr<RankSocket>(new RankSocket(path, fd, std::move(on_message)));
}

RankSocket::RankSocket(std::string path, int listen_fd, MessageCallback on_message)
    : path_(std::move(path)), listen_fd_(listen_fd), on_message_(std::move(on_message)) {
  reader_ = std::thread([this] { ReadLoop(); });
}

RankSocket::~RankSocket() {
  {
    absl::MutexLock lock(&mu_);
    ShutdownLocked();
  }
  reader_.join();
  // Closed only now: the reader may use the fds until it has returned.
  absl::MutexLock lock(&mu_);
  if (conn_fd_ >= 0) close(conn_fd_);
  close(listen_fd_);
  unlink(path_.c_str());
}

void RankSocket::ShutdownLocked() {
  if (shut_down_) return;
  shut_down_ = true;
  // shutdown() wakes a thread blocked in accept() or read() on Linux;
  // close() would not, and would free the fd for reuse under it.
  shutdown(listen_fd_, SHUT_RDWR);
  if (conn_fd_ >= 0) shutdown(conn_fd_, SHUT_RDWR);
}

void RankSocket::ReadLoop() {
  int fd = -1;
  while (fd < 0) {
    // Wakes for a connection, or every 100 ms to notice a shutdown.
    pollfd p{listen_fd_, POLLIN, 0};
    poll(&p, 1, 100);
    absl::MutexLock lock(&mu_);
    if (shut_down_) break;
    // Accepting under the lock makes "left the backlog" and "connected" one
    // step as Drain sees them. Otherwise a rank that connected, wrote and
    // exited at once could be shut down unread in between.
    fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      conn_fd_ = fd;
      connected_ = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
      break;
    }
  }
  if (fd >= 0) {
    RankFrameReader frames;
    v1::RankMessage message;
    char buffer[64 * 1024];
    // A frame that cannot be delimited or parsed ends the channel: the
    // stream cannot be resynced.
    bool readable = true;
    while (readable) {
      const ssize_t n = read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      frames.Append(absl::string_view(buffer, static_cast<size_t>(n)));
      while (true) {
        const absl::StatusOr<std::optional<absl::string_view>> frame = frames.Next();
        if (frame.ok() && !frame->has_value()) break;
        if (!frame.ok() ||
            !message.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size()))) {
          readable = false;
          break;
        }
        on_message_(message);
      }
    }
  }
  absl::MutexLock lock(&mu_);
  reader_done_ = true;
}

absl::Status RankSocket::Send(const v1::RankControl& control) {
  std::string wire;
  {
    google::protobuf::io::StringOutputStream out(&wire);
    if (!google::protobuf::util::SerializeDelimitedToZeroCopyStream(control, &out)) {
      return absl::InternalError("cannot serialise RankControl");
    }
  }
  absl::MutexLock lock(&mu_);
  if (!connected_) return absl::FailedPreconditionError("the rank has not connected yet");
  size_t sent = 0;
  while (sent < wire.size()) {
    // Never blocks the caller on a rank that stopped reading.
    const ssize_t n =
        send(conn_fd_, wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot write to rank socket ", path_, ": ", std::strerror(errno)));
    }
    sent += n;
  }
  return absl::OkStatus();
}

void RankSocket::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  if (!connected_) {
    // A rank that connected and exited at once may still be in the backlog.
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 0) == 1) {
      mu_.AwaitWithDeadline(absl::Condition(this, &RankSocket::Connected), deadline);
    }
  }
  if (connected_) mu_.AwaitWithDeadline(absl::Condition(this, &RankSocket::ReaderDone), deadline);
  ShutdownLocked();
}

}  // namespace ballast::agent
