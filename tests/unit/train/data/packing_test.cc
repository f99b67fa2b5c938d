#include "worker/train/data/packing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>

namespace ballast::train {
namespace {

using ::testing::ElementsAre;

std::vector<int64_t> Iota(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The fills of the rows, sorted: what the packing is, whatever the items.
std::vector<int64_t> Fills(const PackedRows& rows, const std::vector<int64_t>& lengths) {
  std::vector<int64_t> fills;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    int64_t fill = 0;
    for (int64_t k = rows.row_offsets[r]; k < rows.row_offsets[r + 1]; ++k) {
      fill += lengths[rows.items[k]];
    }
    fills.push_back(fill);
  }
  std::sort(fills.begin(), fills.end());
  return fills;
}

TEST(PackingTest, PutsEachItemInTheTightestRowThatHoldsIt) {
  // Decreasing: 7 opens row 0 (room 3), 6 opens row 1 (room 4), 4 fits only
  // row 1 exactly, 3 fits row 0 exactly, 2 and 1 open row 2.
  const std::vector<int64_t> lengths = {3, 7, 1, 6, 4, 2};
  const PackedRows rows = PackBestFitDecreasing(Iota(6), lengths, 10);
  EXPECT_THAT(rows.row_offsets, ElementsAre(0, 2, 4, 6));
  EXPECT_THAT(rows.items, ElementsAre(1, 0, 3, 4, 5, 2));
}

TEST(PackingTest, HoldsEveryItemOnceWithinCapacityWhateverTheOrder) {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t capacity = std::uniform_int_distribution<int64_t>(1, 4096)(rng);
    const int64_t n = std::uniform_int_distribution<int64_t>(1, 2000)(rng);
    std::vector<int64_t> lengths(n);
    int64_t total = 0;
    for (int64_t& l : lengths) {
      l = std::uniform_int_distribution<int64_t>(1, capacity)(rng);
      total += l;
    }
    std::vector<int64_t> order = Iota(n);
    const PackedRows rows = PackBestFitDecreasing(order, lengths, capacity);
    std::vector<int64_t> items = rows.items;
    std::sort(items.begin(), items.end());
    ASSERT_EQ(items, Iota(n));
    const std::vector<int64_t> fills = Fills(rows, lengths);
    ASSERT_LE(fills.back(), capacity);
    ASSERT_GE(rows.rows(), (total + capacity - 1) / capacity);
    // BFD never leaves two rows that one could hold: else the later item
    // would have fitted the earlier row.
    if (fills.size() >= 2) ASSERT_GT(fills[0] + fills[1], capacity);
    // The packing is a function of the lengths alone: another order of the
    // same items gives the same rows' fills (the data cursor relies on it).
    std::shuffle(order.begin(), order.end(), rng);
    ASSERT_EQ(Fills(PackBestFitDecreasing(order, lengths, capacity), lengths), fills);
  }
}

TEST(PackingTest, ShortDocumentsFillRowsAlmostWholly) {
  std::mt19937_64 rng(1234);
  std::vector<int64_t> lengths(20000);
  int64_t total = 0;
  for (int64_t& l : lengths) total += l = std::uniform_int_distribution<int64_t>(16, 1024)(rng);
  const PackedRows rows = PackBestFitDecreasing(Iota(20000), lengths, 4096);
  EXPECT_GT(static_cast<double>(total) / (rows.rows() * 4096.0), 0.99);
}

}  // namespace
}  // namespace ballast::train
