// The framing of the rank channel (proto/ballast/v1/rank_channel.proto), the
// Unix socket between ballast-worker and each ballast-train rank: protobuf's
// delimited format, a varint32 length then that many bytes of one message.
// Both ends cut their byte stream into frames with RankFrameReader, so a
// length that could not come from the other end is refused alike on both.
#ifndef BALLAST_COMMON_RANK_FRAMES_H_
#define BALLAST_COMMON_RANK_FRAMES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ballast {

// The largest message either end sends is a log line or a report of a few
// KiB; a length past this is a corrupt stream, and buffering up to it would
// hold memory for a frame that never completes.
inline constexpr uint32_t kMaxRankFrameBytes = 16 << 20;

// Cuts a byte stream into frames. Thread-compatible: one reader per stream.
class RankFrameReader {
 public:
  // Adds the bytes that arrived next.
  void Append(absl::string_view bytes);

  // The payload of the next whole frame, valid until the next Append;
  // nullopt while the next frame is incomplete. DATA_LOSS when a
  // length prefix is longer than a varint32 or announces more than
  // kMaxRankFrameBytes: the stream cannot be resynchronised, so every later
  // call returns that error again.
  absl::StatusOr<std::optional<absl::string_view>> Next();

  // Bytes appended and not yet returned in a frame.
  size_t buffered() const { return buffer_.size() - consumed_; }

 private:
  std::string buffer_;
  // Bytes at the front of buffer_ that Next has returned already.
  size_t consumed_ = 0;
  absl::Status error_;
};

}  // namespace ballast

#endif  // BALLAST_COMMON_RANK_FRAMES_H_
