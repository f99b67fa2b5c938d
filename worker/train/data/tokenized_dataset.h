// Pre-tokenized training data and its packing into micro-batches.
//
// The file is JSONL, one example per line: {"input_ids": [int...],
// "labels": [int...]} with labels optional (then every token is supervised)
// and -100 marking unsupervised positions. An example is one document; a
// micro-batch packs micro_batch_size documents along one token axis with
// cu_seqlens, so there is no padding and no attention across documents. The
// target of position t is labels[t + 1] of the same document; a document's
// last position has none.
//
// Order: epoch e visits examples in a permutation drawn from (seed, e) by a
// fixed Fisher-Yates over SplitMix64, or in file order without shuffle. The
// whole position is one integer (examples consumed), which is what a
// checkpoint stores to resume on the same data.
//
// Thread-compatible: Pack and IndexAt cache the permutation of the epoch last
// asked for, so one thread uses a dataset at a time.
#ifndef BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_
#define BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/train/data/packed_batch.h"

namespace ballast::train {

struct Example {
  std::vector<int64_t> input_ids;
  std::vector<int64_t> labels;  // same length; -100 = unsupervised
};

class TokenizedDataset {
 public:
  // Reads every example. Errors (INVALID_ARGUMENT, naming file and line): bad
  // JSON, missing input_ids, a token outside [0, vocab_size), labels of another
  // length, an example longer than seq_len (never truncated silently), an
  // example shorter than 2 tokens, or an empty file.
  static absl::StatusOr<TokenizedDataset> Load(const std::string& path, int64_t vocab_size,
                                               int64_t seq_len);

  int64_t size() const { return static_cast<int64_t>(examples_.size()); }
  const Example& example(int64_t i) const { return examples_[i]; }

  // The index of the example at global position `cursor` (cursor / size() is the epoch).
  int64_t IndexAt(int64_t cursor, bool shuffle, uint64_t seed);

  // Packs the examples at positions [cursor, cursor + count) into one causal
  // batch; document_ids are their indices in the file.
  PackedBatch Pack(int64_t cursor, int64_t count, bool shuffle, uint64_t seed);

 private:
  std::vector<Example> examples_;
  // Permutation of the epoch last asked for.
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_TOKENIZED_DATASET_H_
