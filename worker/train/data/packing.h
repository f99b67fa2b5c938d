// Best-fit-decreasing packing of documents (or groups that must stay whole)
// into rows of at most `capacity` tokens.
//
// Items go in order of decreasing length, each into the open row with the
// least room that still holds it, or into a new row. BFD uses at most
// 11/9 OPT + 6/9 rows (Dósa 2007), and in practice fills rows to within a
// few percent when documents are short against the row.
//
// Which row an item lands in depends only on the sequence of lengths, so a
// reshuffled epoch of the same documents packs into the same number of rows
// with the same fills: the data cursor's row count per epoch is fixed.
#ifndef BALLAST_WORKER_TRAIN_DATA_PACKING_H_
#define BALLAST_WORKER_TRAIN_DATA_PACKING_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ballast::train {

struct PackedRows {
  // Row r holds items[row_offsets[r] .. row_offsets[r + 1]).
  std::vector<int64_t> row_offsets = {0};
  std::vector<int64_t> items;

  int64_t rows() const { return static_cast<int64_t>(row_offsets.size()) - 1; }
};

// Packs the items of `order` (indices into `lengths`); equal lengths keep
// their order in `order`, so a shuffled order packs differently. Every
// length must lie in [1, capacity].
PackedRows PackBestFitDecreasing(absl::Span<const int64_t> order, absl::Span<const int64_t> lengths,
                                 int64_t capacity);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_PACKING_H_
