// TokenCache: a training set tokenized once per job into the job's folder,
// and read back mapped, so that restarts, rollbacks and the ranks of one
// machine never tokenize it again.
//
//   DIR/documents.ids     int32 token ids of every document, back to back
//   DIR/documents.labels  int32 labels (kIgnoreLabel: not trained), likewise
//   DIR/documents.index   per document: int64 offset, length, source line,
//                         group, relevance
//   DIR/cache.json        format version, fingerprint and statistics,
//                         written last: without it, or with another
//                         fingerprint, the cache is built again.
//
// Building reads the data once (record_reader.h: a JSONL file, or a parquet
// or Arrow data set row group by row group), encodes chunks of records on a
// few threads while it reads on (at most 2 x threads chunks in memory, each
// of at most 256 records or about 1 MiB of lines), and writes the documents
// in file order. Bad records and over-long documents follow the options;
// every error names the file and the line (or row).
//
// Thread-safe after construction: the accessors are const views.
#ifndef BALLAST_WORKER_TRAIN_DATA_TOKEN_CACHE_H_
#define BALLAST_WORKER_TRAIN_DATA_TOKEN_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/train/data/document_encoder.h"
#include "worker/train/data/record_reader.h"
#include "worker/train/io/mapped_file.h"

namespace ballast::train {

// data.truncate: what a document longer than seq_len becomes.
enum class Truncate { kError, kCut, kDrop };

struct DataStatistics {
  int64_t records = 0;            // non-blank lines read
  int64_t documents = 0;          // in the cache
  int64_t skipped_records = 0;    // bad records skipped (data.on_bad_record: skip)
  int64_t cut_documents = 0;      // cut to seq_len tokens
  int64_t dropped_documents = 0;  // longer than seq_len, or with nothing trained left after the cut
  int64_t tokens = 0;
  int64_t trained_tokens = 0;  // positions with a target: labels[t + 1] != kIgnoreLabel
  // Records encoded that held special-token text (document_encoder.h), as
  // plain text or as special tokens by data.allow_special_tokens.
  int64_t special_token_records = 0;
  // The first few skipped records, as "path:line: what is wrong".
  std::vector<std::string> bad_record_examples;
};

struct TokenCacheOptions {
  std::string data_path;
  // The spec's field that names data_path, which errors in reading the file
  // (not its records) start with; empty when the caller names it.
  std::string data_path_name = "data.path";
  // A parquet or Arrow data set's columns under other names (data.columns).
  v1::DataColumns columns;
  // The most tokens a document may have, and what the messages call it.
  int64_t seq_len = 0;
  std::string seq_len_name = "data.seq_len";
  Truncate truncate = Truncate::kError;
  bool skip_bad_records = false;
  // A longer JSONL line is an error, never read whole.
  int64_t max_line_bytes = 0;
  int threads = 2;
  // Everything the documents depend on (the data file's identity, the
  // tokenizer, the format, template and options): a cache built for another
  // fingerprint is built again.
  std::string fingerprint;
};

class TokenCache {
 public:
  // The cache in `dir` when it was built for options.fingerprint; else
  // builds it there with `encoder`. Ranks sharing `dir` take turns under a
  // lock on DIR/.lock, so the first builds and the others read. Errors:
  // INVALID_ARGUMENT "path:line: ..." for a bad record under "fail" or a
  // document longer than seq_len under "error", and when no document is
  // left; FAILED_PRECONDITION from the encoder (a tokenizer that does not
  // belong to the model); the errno's status for the folder's files.
  static absl::StatusOr<TokenCache> OpenOrBuild(const std::string& dir,
                                                const DocumentEncoder& encoder,
                                                const TokenCacheOptions& options);

  // The same documents in memory, for a file read once (a check, the
  // logits of a tokens file). Errors as OpenOrBuild's.
  static absl::StatusOr<TokenCache> BuildInMemory(const DocumentEncoder& encoder,
                                                  const TokenCacheOptions& options);

  int64_t documents() const { return static_cast<int64_t>(index_size_); }
  int64_t length(int64_t document) const { return index_[5 * document + 1]; }
  // The 0-based line of the data file the document came from (a data
  // set's row, counted over its files).
  int64_t line(int64_t document) const { return index_[5 * document + 2]; }
  // Documents that packing keeps together share a group, and a group's
  // documents are consecutive: a reranker record's positive and its
  // negatives. Any other document is a group of its own.
  int64_t group(int64_t document) const { return index_[5 * document + 3]; }
  // A reranker candidate's relevance, 1 or 0; -1 for other documents.
  int64_t relevance(int64_t document) const { return index_[5 * document + 4]; }
  absl::Span<const int32_t> input_ids(int64_t document) const {
    return {ids_ + index_[5 * document], static_cast<size_t>(length(document))};
  }
  absl::Span<const int32_t> labels(int64_t document) const {
    return {labels_ + index_[5 * document], static_cast<size_t>(length(document))};
  }
  const DataStatistics& statistics() const { return statistics_; }
  // Whether OpenOrBuild tokenized the data (false: it found the cache).
  bool built() const { return built_; }

 private:
  TokenCache() = default;
  static absl::StatusOr<TokenCache> Open(const std::string& dir, const std::string& fingerprint);
  class Writer;  // token_cache.cc
  // Reads and encodes the data file into `writer`, in file order.
  static absl::Status Encode(const DocumentEncoder& encoder, const TokenCacheOptions& options,
                             Writer* writer);

  // What keeps the three arrays alive: the mapped files, or vectors.
  std::vector<std::shared_ptr<const void>> storage_;
  const int32_t* ids_ = nullptr;
  const int32_t* labels_ = nullptr;
  const int64_t* index_ = nullptr;
  size_t index_size_ = 0;
  DataStatistics statistics_;
  bool built_ = false;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_TOKEN_CACHE_H_
