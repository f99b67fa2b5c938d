// TokenizedDataset: the documents of a TokenCache in training order, as rows
// of at most seq_len tokens, and the packing of rows into micro-batches.
//
// Groups: every group of the cache, or one side of eval.fraction's split
// (GroupSplit below). Order: epoch e draws a permutation of the groups (a document, or a
// reranker record's candidates, which are never split) from (seed, e) by a
// fixed Fisher-Yates over SplitMix64 (file order without shuffle). Without
// packing each row is one group in that order. With packing the permuted
// groups are packed best fit decreasing into rows of seq_len tokens
// (packing.h), and the rows are permuted again from (seed, e). The
// number of rows is the same in every epoch, so the whole position is one
// integer, the rows consumed: the data cursor a checkpoint stores. It means
// the same at any world size.
//
// A row holds whole documents along one token axis with cu_seqlens: no
// padding, no attention across documents, positions restarting at 0 in each,
// and the target of position t is labels[t + 1] of the same document, so no
// label crosses a boundary.
//
// Thread-compatible: the order of the epoch last asked for is cached, so one
// thread uses a dataset at a time.
#ifndef BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_
#define BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/train/data/block_diffusion_noise.h"
#include "worker/train/data/packed_batch.h"
#include "worker/train/data/packing.h"
#include "worker/train/data/token_cache.h"

namespace ballast::train {

// eval.fraction's split of a cache's groups (documents, or a reranker
// record's candidates): the first HeldOutGroups(groups, fraction) of a
// Fisher-Yates permutation of the groups over SplitMix64 from `seed` are
// held out. It depends on the seed and the group count alone.
struct GroupSplit {
  double fraction = 0;  // 0: no split, every group
  uint64_t seed = 0;
  // The side a dataset reads: the held-out groups, or the others (with a
  // fraction; without one every group).
  bool held_out = false;
};

// round(fraction x groups), at least 1 and at most groups - 1; groups must
// be at least 2.
int64_t HeldOutGroups(int64_t groups, double fraction);

struct DataOrder {
  int64_t seq_len = 0;
  bool packing = false;
  bool shuffle = true;
  uint64_t seed = 0;
  // Block diffusion (block_length > 0): each document packs as [x_t ; x_0],
  // twice its tokens, into block-diffusion batches.
  DiffusionNoise diffusion;
  // The groups read: every one, or one side of a split.
  GroupSplit split;
};

// One epoch's rows, for the events.
struct EpochPacking {
  int64_t rows = 0;
  int64_t tokens = 0;
  // tokens / (rows x seq_len): the share of the rows' room that holds data.
  double efficiency = 0;
};

class TokenizedDataset {
 public:
  TokenizedDataset(TokenCache cache, DataOrder order);

  // A pre-tokenized file ({"input_ids", "labels"?} lines) read into memory,
  // one document per row in file order unless `order` says otherwise; every
  // error names the file and line (TokenCache's). For tools and tests.
  static absl::StatusOr<TokenizedDataset> Load(const std::string& path, int64_t vocab_size,
                                               int64_t seq_len);

  const TokenCache& cache() const { return cache_; }
  const DataOrder& order() const { return order_; }
  int64_t rows_per_epoch() const { return rows_per_epoch_; }
  EpochPacking packing() const;

  // The documents (cache indices) of the row at global position `cursor`.
  std::vector<int64_t> RowDocuments(int64_t cursor);

  // The 0-based data-file lines of the documents in rows [cursor, cursor + rows).
  std::vector<int64_t> DocumentLines(int64_t cursor, int64_t rows);

  // The rows at [cursor, cursor + rows) as one micro-batch, causal or (with
  // order.diffusion) block diffusion; document_ids are the documents'
  // data-file lines. Reranker candidates also get group_offsets and
  // relevance.
  PackedBatch Pack(int64_t cursor, int64_t rows);

 private:
  void PlanEpoch(int64_t epoch);

  TokenCache cache_;
  DataOrder order_;
  // Group g is documents [group_starts_[g], group_ends_[g]), of
  // group_lengths_[g] tokens.
  std::vector<int64_t> group_starts_;
  std::vector<int64_t> group_ends_;
  std::vector<int64_t> group_lengths_;
  int64_t rows_per_epoch_ = 0;
  // The rows of the epoch last asked for.
  int64_t planned_epoch_ = -1;
  PackedRows rows_;
  std::vector<int64_t> row_order_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_
