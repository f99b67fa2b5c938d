// The files a spec's data path names. data.path may be one file (JSONL, or a
// .parquet or .arrow file) or a folder: a `datasets.save_to_disk` folder of
// Arrow IPC stream files, or a folder of parquet shards. ballastd checks the
// files at submission and the trainer reads them, in this one order.
#ifndef BALLAST_COMMON_DATA_FILES_H_
#define BALLAST_COMMON_DATA_FILES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ballast {

// The data files of `path`, in reading order. A file is itself. A folder
// with a state.json (what save_to_disk writes beside dataset_info.json) is
// the files its "_data_files" name; any other folder is its *.parquet files,
// by name. INVALID_ARGUMENT, naming the folder, for a folder with no data
// file, a DatasetDict folder (its splits are folders: name one), and a
// state.json that is not save_to_disk's or names a file outside the folder;
// NOT_FOUND when `path` does not exist. Reads directory entries and
// state.json only: whoever opens the files checks them (CheckRegularFile).
absl::StatusOr<std::vector<std::string>> ListDataFiles(const std::string& path);

}  // namespace ballast

#endif  // BALLAST_COMMON_DATA_FILES_H_
