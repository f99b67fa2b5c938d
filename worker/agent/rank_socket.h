// RankSocket: the worker's end of the Unix-socket channel to one rank.
//
// The rank (ballast-train --agent-socket PATH) connects once and sends
// RankMessages; the worker sends RankControl down. Both directions use
// protobuf's delimited format (varint length, then the message).
//
// Thread-safe: Send and Drain may be called from any thread; the message
// callback runs on the socket's own reader thread.
#ifndef BALLAST_WORKER_AGENT_RANK_SOCKET_H_
#define BALLAST_WORKER_AGENT_RANK_SOCKET_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ballast/v1/rank_channel.pb.h"

namespace ballast::agent {

class RankSocket {
 public:
  using MessageCallback = std::function<void(const v1::RankMessage&)>;

  // sun_path holds 108 bytes including the terminating NUL.
  static constexpr size_t kMaxPathBytes = 107;

  // Listens on `path` (a stale file there is replaced) and accepts one rank.
  // `on_message` gets each message in order, on the reader thread.
  // INVALID_ARGUMENT when the path is too long, INTERNAL when bind fails.
  static absl::StatusOr<std::unique_ptr<RankSocket>> Listen(const std::string& path,
                                                            MessageCallback on_message);

  // Closes both ends, joins the reader thread and removes the socket file.
  ~RankSocket();

  RankSocket(const RankSocket&) = delete;
  RankSocket& operator=(const RankSocket&) = delete;

  const std::string& path() const { return path_; }

  // Sends one control message. FAILED_PRECONDITION when no rank has connected
  // yet, UNAVAILABLE when the rank has gone (never raises SIGPIPE).
  absl::Status Send(const v1::RankControl& control) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits up to `timeout` for the connected rank to close its end, so every
  // message it wrote has reached the callback; then stops reading. Returns at
  // once when no rank ever connected.
  void Drain(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  RankSocket(std::string path, int listen_fd, MessageCallback on_message);
  void ReadLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void ShutdownLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Connected() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return connected_; }
  bool ReaderDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reader_done_; }

  const std::string path_;
  const int listen_fd_;
  const MessageCallback on_message_;

  mutable absl::Mutex mu_;
  int conn_fd_ ABSL_GUARDED_BY(mu_) = -1;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;
  bool reader_done_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;

  std::thread reader_;
};

}  // namespace ballast::agent

#endif  // BALLAST_WORKER_AGENT_RANK_SOCKET_H_
