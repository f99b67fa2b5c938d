#include "common/rank_frames.h"

#include "absl/strings/str_cat.h"

namespace ballast {
namespace {

// A varint32 takes at most 5 bytes, 7 bits each.
constexpr size_t kMaxVarint32Bytes = 5;

}  // namespace

void RankFrameReader::Append(absl::string_view bytes) {
  // Dropping the returned frames here, not in Next, keeps Next's view valid
  // and moves each byte once for the frames that follow it in one read.
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  buffer_.append(bytes.data(), bytes.size());
}

absl::StatusOr<std::optional<absl::string_view>> RankFrameReader::Next() {
  if (!error_.ok()) return error_;
  const absl::string_view rest = absl::string_view(buffer_).substr(consumed_);
  uint64_t length = 0;
  size_t prefix = 0;
  while (true) {
    if (prefix == rest.size()) return std::nullopt;
    if (prefix == kMaxVarint32Bytes) {
      error_ = absl::DataLossError(absl::StrCat("rank channel: a frame's length prefix runs past ",
                                                kMaxVarint32Bytes, " bytes"));
      return error_;
    }
    const auto byte = static_cast<uint8_t>(rest[prefix]);
    length |= static_cast<uint64_t>(byte & 0x7f) << (7 * prefix);
    ++prefix;
    if ((byte & 0x80) == 0) break;
  }
  if (length > kMaxRankFrameBytes) {
    error_ = absl::DataLossError(absl::StrCat("rank channel: a frame of ", length,
                                              " bytes; allowed: at most ", kMaxRankFrameBytes));
    return error_;
  }
  if (rest.size() - prefix < length) return std::nullopt;
  consumed_ += prefix + length;
  return rest.substr(prefix, length);
}

}  // namespace ballast
