#include "worker/train/data/packing.h"

#include <algorithm>
#include <set>
#include <utility>

namespace ballast::train {

PackedRows PackBestFitDecreasing(absl::Span<const int64_t> order, absl::Span<const int64_t> lengths,
                                 int64_t capacity) {
  std::vector<int64_t> sorted(order.begin(), order.end());
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  // Open rows by (room left, row): lower_bound finds the tightest fit, and the
  // lowest row among equal rooms, which keeps the packing a function of the
  // lengths alone.
  std::set<std::pair<int64_t, int64_t>> open;
  std::vector<std::vector<int64_t>> rows;
  for (const int64_t item : sorted) {
    const int64_t length = lengths[item];
    auto fit = open.lower_bound({length, 0});
    int64_t row;
    int64_t room;
    if (fit == open.end()) {
      row = static_cast<int64_t>(rows.size());
      rows.emplace_back();
      room = capacity;
    } else {
      std::tie(room, row) = *fit;
      open.erase(fit);
    }
    rows[row].push_back(item);
    if (room - length > 0) open.emplace(room - length, row);
  }
  PackedRows packed;
  packed.items.reserve(sorted.size());
  for (const std::vector<int64_t>& row : rows) {
    packed.items.insert(packed.items.end(), row.begin(), row.end());
    packed.row_offsets.push_back(static_cast<int64_t>(packed.items.size()));
  }
  return packed;
}

}  // namespace ballast::train
