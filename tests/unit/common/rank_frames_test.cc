#include "common/rank_frames.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

namespace ballast {
namespace {

// The next frame as a string; "<incomplete>" while it is, the status when
// the stream is broken.
std::string NextFrame(RankFrameReader& reader) {
  absl::StatusOr<std::optional<absl::string_view>> frame = reader.Next();
  if (!frame.ok()) return frame.status().ToString();
  if (!frame->has_value()) return "<incomplete>";
  return std::string(**frame);
}

TEST(RankFrameReaderTest, AFrameArrivingByteByByteIsWholeOnlyAtItsLastByte) {
  RankFrameReader reader;
  const std::string stream = std::string("\x03", 1) + "abc" + std::string("\x00", 1);
  for (size_t i = 0; i < 3; ++i) {
    reader.Append(stream.substr(i, 1));
    EXPECT_EQ(NextFrame(reader), "<incomplete>");
  }
  reader.Append(stream.substr(3));
  EXPECT_EQ(NextFrame(reader), "abc");
  EXPECT_EQ(NextFrame(reader), "");  // an empty message is a frame too
  EXPECT_EQ(NextFrame(reader), "<incomplete>");
  EXPECT_EQ(reader.buffered(), 0u);
}

TEST(RankFrameReaderTest, ALengthPastTheLimitBreaksTheStreamForGood) {
  RankFrameReader reader;
  // 2^28, a varint of 5 bytes, more than kMaxRankFrameBytes.
  reader.Append(std::string("\x80\x80\x80\x80\x01", 5));
  const std::string first = NextFrame(reader);
  EXPECT_NE(first.find("DATA_LOSS"), std::string::npos) << first;
  EXPECT_NE(first.find("268435456 bytes"), std::string::npos) << first;
  reader.Append(std::string("\x01x", 2));
  EXPECT_EQ(NextFrame(reader), first);
}

TEST(RankFrameReaderTest, ALengthPrefixOfSixBytesIsDataLoss) {
  RankFrameReader reader;
  reader.Append(std::string("\x80\x80\x80\x80\x80", 5));
  EXPECT_EQ(NextFrame(reader), "<incomplete>");
  reader.Append(std::string("\x00", 1));
  EXPECT_NE(NextFrame(reader).find("DATA_LOSS"), std::string::npos);
}

}  // namespace
}  // namespace ballast
