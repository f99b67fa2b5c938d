#include "common/rank_event_bound.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace ballast {
namespace {

using ::testing::HasSubstr;

v1::RankEvent EventOf(int32_t rank) {
  v1::RankEvent e;
  e.set_job_id("job-1");
  e.set_attempt(2);
  e.set_rank(rank);
  return e;
}

TEST(BoundRankEventTest, EventsWithinTheBoundAreLeftAlone) {
  v1::RankEvent e = EventOf(1);
  e.mutable_training()->mutable_log()->set_text(std::string(kMaxRankEventBytes - 64, 'x'));
  const std::string before = e.SerializeAsString();
  EXPECT_FALSE(BoundRankEvent(&e));
  EXPECT_EQ(e.SerializeAsString(), before);
}

TEST(BoundRankEventTest, AnOversizedTrainingEventBecomesAWarningNamingItsKindAndSize) {
  v1::RankEvent e = EventOf(3);
  v1::DataReport* data = e.mutable_training()->mutable_data();
  for (int i = 0; i < 100; ++i) data->add_bad_record_examples(std::string(4 << 10, 'b'));
  const size_t bytes = e.ByteSizeLong();
  ASSERT_TRUE(BoundRankEvent(&e));
  EXPECT_LE(e.ByteSizeLong(), kMaxRankEventBytes);
  EXPECT_EQ(e.job_id(), "job-1");
  EXPECT_EQ(e.attempt(), 2);
  EXPECT_EQ(e.rank(), 3);
  ASSERT_TRUE(e.training().has_log());
  EXPECT_EQ(e.training().log().level(), "warning");
  EXPECT_EQ(e.training().log().rank(), 3);
  EXPECT_THAT(e.training().log().text(),
              HasSubstr("dropped a data event of " + std::to_string(bytes) + " bytes from rank 3"));
}

// A newer trainer's kind (or a hostile worker's bytes) is an unknown field:
// the note calls it a training event, and none of its bytes stay.
TEST(BoundRankEventTest, AnOversizedKindThisBuildDoesNotKnowLeavesNoneOfItsBytes) {
  v1::RankEvent e = EventOf(0);
  const std::string payload(kMaxRankEventBytes, 'u');
  // Field 15, wire type 2, then a varint length of 262144.
  std::string wire = std::string("\x7a\x80\x80\x10", 4) + payload;
  ASSERT_TRUE(e.mutable_training()->ParseFromString(wire));
  ASSERT_TRUE(BoundRankEvent(&e));
  EXPECT_LT(e.ByteSizeLong(), 1024u);
  EXPECT_THAT(e.training().log().text(), HasSubstr("dropped a training event of"));
}

TEST(BoundRankEventTest, AnExitKeepsItsCodeAndTheLastBytesOfItsTailOnACharacter) {
  v1::RankEvent e = EventOf(0);
  e.mutable_exited()->set_exit_code(137);
  // Two-byte characters at odd offsets from the end: the cut lands inside one.
  const std::string tail = "head\n" + std::string(kMaxStderrTailBytes, 'x') + "\xc3\xa9" +
                           std::string(kMaxStderrTailBytes - 4, 'y') + "end";
  e.mutable_exited()->set_stderr_tail(tail);
  ASSERT_TRUE(BoundRankEvent(&e));
  EXPECT_EQ(e.exited().exit_code(), 137);
  const std::string& kept = e.exited().stderr_tail();
  EXPECT_EQ(kept.size(), kMaxStderrTailBytes - 1);  // the 0xa9 continuation byte went too
  EXPECT_EQ(kept.substr(0, 1), "y");
  EXPECT_EQ(kept.substr(kept.size() - 3), "end");
}

}  // namespace
}  // namespace ballast
