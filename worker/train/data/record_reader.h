// RecordReader: the records of a training set, in order, from whatever
// data.path names (common/data_files.h): a JSONL file, a record per non-blank
// line; or a parquet file, a folder of parquet shards or a
// datasets.save_to_disk folder of Arrow IPC streams, a record per row
// (columnar_records.h). The token cache reads every source through it, so a
// row becomes the same record, and the same documents, as the JSONL line
// that holds its values.
//
// A reader hands out records unparsed: the token cache parses them on its
// encoding threads. It holds a bounded amount: a line, or one row group (one
// record batch of an Arrow stream) and whatever batches the records handed
// out still keep alive.
//
// Thread-compatible; a RawRecord may be parsed on any thread.
#ifndef BALLAST_WORKER_TRAIN_DATA_RECORD_READER_H_
#define BALLAST_WORKER_TRAIN_DATA_RECORD_READER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ballast/v1/job_spec.pb.h"
#include "nlohmann/json_fwd.hpp"

namespace ballast::train {

// Rows of a columnar data set that turn into records; columnar_records.cc.
class RowBatch {
 public:
  virtual ~RowBatch() = default;
  // Row `row` as the JSON record a JSONL line with its values would parse to.
  // INVALID_ARGUMENT "column 'c' is null" for a null in a column read.
  virtual absl::StatusOr<nlohmann::json> Record(int64_t row) const = 0;
};

// One record as read. Either `line` (JSONL) or `batch` and `row` (columnar).
struct RawRecord {
  // 0-based: the line of a JSONL file, the row of a data set (counted over
  // all its files). The token cache keeps it as the document's source line.
  int64_t index = 0;
  std::string line;
  std::shared_ptr<const RowBatch> batch;
  int64_t row = 0;
};

// The record as JSON: the line parsed (ParseRecord's errors) or the row
// converted (RowBatch::Record's).
absl::StatusOr<nlohmann::json> ParseRawRecord(const RawRecord& record);

struct RecordReaderOptions {
  // A longer JSONL line is an error, never read whole.
  int64_t max_line_bytes = 0;
  // Columnar sets: the columns under other names than the record keys.
  v1::DataColumns columns;
};

class RecordReader {
 public:
  // The reader for `path`: a folder, or a file ending in .parquet or .arrow,
  // is columnar, any other file JSONL (LineReader's .zst included).
  // INVALID_ARGUMENT naming the file for a folder without data, columns
  // given for a JSONL file, an unreadable file, a corrupt or cut parquet
  // footer, a missing or mistyped column (columnar_records.h); NOT_FOUND
  // when `path` does not exist.
  static absl::StatusOr<std::unique_ptr<RecordReader>> Open(const std::string& path,
                                                            const RecordReaderOptions& options);
  virtual ~RecordReader() = default;

  // The next record into `*record`: true, or false after the last.
  // INVALID_ARGUMENT naming the file (and the line, or the row group) for
  // what cannot be read: an over-long line, a corrupt page, a file cut short,
  // a shard whose columns do not fit.
  virtual absl::StatusOr<bool> Next(RawRecord* record) = 0;

  // Where record `index` (one Next has returned) comes from, to start an
  // error message: "path:LINE" (1-based) or "path: row ROW" (0-based within
  // its file, as pyarrow and datasets count).
  virtual std::string Where(int64_t index) const = 0;
};

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_RECORD_READER_H_
