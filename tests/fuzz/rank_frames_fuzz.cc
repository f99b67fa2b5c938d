// Fuzzes the rank channel's framing (common/rank_frames.h) as both ends
// meet it: the worker's RankSocket parses each frame as a RankMessage, the
// rank's AgentChannel as a RankControl.
//
// Input: one byte that sets how many bytes each read delivers (1 to 256),
// then the byte stream.
//
// Invariants beyond not crashing: the frames, and where the stream breaks,
// do not depend on how the stream was cut into reads; errors are
// DATA_LOSS and stay; a reader never holds more than a frame's worth of
// bytes past the frames it returned.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "ballast/v1/rank_channel.pb.h"
#include "common/rank_frames.h"
#include "tests/fuzz/invariant.h"

namespace {

using ballast::fuzz::Require;

struct Outcome {
  std::vector<std::string> frames;
  bool broken = false;
};

// Feeds `stream` to a reader `chunk` bytes at a time, as reads deliver it.
Outcome Read(absl::string_view stream, size_t chunk) {
  ballast::RankFrameReader reader;
  Outcome outcome;
  for (size_t at = 0; at < stream.size() && !outcome.broken; at += chunk) {
    reader.Append(stream.substr(at, chunk));
    while (true) {
      const absl::StatusOr<std::optional<absl::string_view>> frame = reader.Next();
      if (!frame.ok()) {
        Require(absl::IsDataLoss(frame.status()), "a broken stream is DATA_LOSS", frame.status());
        Require(reader.Next().status() == frame.status(), "a broken stream stays broken");
        outcome.broken = true;
        break;
      }
      if (!frame->has_value()) break;
      outcome.frames.emplace_back(**frame);
      // Both ends parse what they receive; a frame that is no message is
      // their business, not the framing's.
      ballast::v1::RankMessage message;
      (void)message.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size()));
      ballast::v1::RankControl control;
      (void)control.ParseFromArray((*frame)->data(), static_cast<int>((*frame)->size()));
    }
    Require(reader.buffered() <= ballast::kMaxRankFrameBytes + 5,
            "at most one frame and its prefix wait");
  }
  return outcome;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t chunk = size_t{data[0]} + 1;
  const absl::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  const Outcome pieces = Read(stream, chunk);
  const Outcome whole = Read(stream, std::max<size_t>(stream.size(), 1));
  Require(pieces.frames == whole.frames && pieces.broken == whole.broken,
          "frames do not depend on how reads cut the stream");
  return 0;
}
