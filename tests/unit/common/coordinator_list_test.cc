#include "common/coordinator_list.h"

#include <gtest/gtest.h>

namespace ballast {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(CoordinatorListTest, OneAddressStaysWhateverHappens) {
  CoordinatorList list("a:1");
  EXPECT_FALSE(list.several());
  EXPECT_FALSE(list.Next("", kStart));
  EXPECT_EQ(list.current(), "a:1");
}

TEST(CoordinatorListTest, FollowsTheNamedLeaderAndRotatesPastOnesThatDoNotAnswer) {
  CoordinatorList list("a:1, b:1,c:1");
  EXPECT_TRUE(list.several());
  EXPECT_EQ(list.current(), "a:1");
  // a standby names c: follow it, even past b.
  EXPECT_TRUE(list.Next("c:1", kStart));
  EXPECT_EQ(list.current(), "c:1");
  // c does not answer: the next one, wrapping around.
  EXPECT_TRUE(list.Next("", kStart));
  EXPECT_EQ(list.current(), "a:1");
  // A leader outside the list (its --advertise) is followed too.
  EXPECT_TRUE(list.Next("d:1", kStart));
  EXPECT_EQ(list.current(), "d:1");
}

// Until the dead leader's lease expires, a standby names it: the client
// stays on the standby instead of going back, until kUnreachableMemory.
TEST(CoordinatorListTest, AStandbyNamingALeaderThatDidNotAnswerIsNotFollowedBackForAWhile) {
  CoordinatorList list("a:1,b:1");
  EXPECT_TRUE(list.Next("", kStart));  // a died
  EXPECT_EQ(list.current(), "b:1");
  EXPECT_FALSE(list.Next("a:1", kStart + absl::Seconds(1)));
  EXPECT_EQ(list.current(), "b:1");
  EXPECT_TRUE(list.Next("a:1", kStart + CoordinatorList::kUnreachableMemory));
  EXPECT_EQ(list.current(), "a:1");
}

}  // namespace
}  // namespace ballast
