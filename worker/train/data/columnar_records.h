// Columnar records: a parquet file, a folder of parquet shards or a
// datasets.save_to_disk folder (Arrow IPC stream files), read with Apache
// Arrow and Parquet C++ as records (record_reader.h), row group by row
// group (record batch by record batch for a stream).
//
// A column of a record key's name (data_format.h's kRecordKeys), or the one
// data.columns names for it, is read; the others are not. Values map to JSON
// as pyarrow's to_pylist() and json.dumps would write them: strings,
// integers, reals and booleans as themselves, lists as arrays, structs as
// objects (a null field left out, as a JSONL record leaves out a key it does
// not have: a message without reasoning_content). So `messages` is a list of
// structs, `input_ids` a list of integers, MTEB's reranking sets' `positive`
// and `negative` lists of strings.
//
// Checked when a file is opened, naming the file and the column: a column
// data.columns names is missing, no column is a record key, a column's type
// is not the key's (`text` of int64). Checked per row, naming file, row and
// column: a null in a column read.
#ifndef BALLAST_WORKER_TRAIN_DATA_COLUMNAR_RECORDS_H_
#define BALLAST_WORKER_TRAIN_DATA_COLUMNAR_RECORDS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/train/data/record_reader.h"

namespace ballast::train {

// The reader of `files` (ListDataFiles's, all .parquet or all .arrow), one
// after the other; errors as RecordReader::Open's and Next's.
absl::StatusOr<std::unique_ptr<RecordReader>> OpenColumnarRecords(std::vector<std::string> files,
                                                                  const v1::DataColumns& columns);

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_COLUMNAR_RECORDS_H_
