#include "common/data_files.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/job_spec_paths.h"
#include "common/regular_file.h"

namespace ballast {
namespace {

namespace fs = std::filesystem;

// save_to_disk's state.json: {"_data_files": [{"filename": "data-00000-of-00001.arrow"}, ...]}.
absl::StatusOr<std::vector<std::string>> SavedDatasetFiles(const fs::path& folder) {
  const std::string state_path = (folder / "state.json").string();
  absl::StatusOr<std::string> text = ReadRegularFile(state_path, kMaxConfigJsonBytes);
  if (!text.ok()) return absl::InvalidArgumentError(text.status().message());
  const nlohmann::json state = nlohmann::json::parse(*text, nullptr, false);
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(state_path, ": ", what,
                     "; a datasets.save_to_disk folder's state.json lists "
                     "its files as {\"_data_files\": [{\"filename\": ...}]}"));
  };
  if (!state.is_object() || !state.contains("_data_files") || !state["_data_files"].is_array()) {
    return bad("no list _data_files");
  }
  std::vector<std::string> files;
  for (const nlohmann::json& entry : state["_data_files"]) {
    if (!entry.is_object() || !entry.contains("filename") || !entry["filename"].is_string()) {
      return bad("an entry of _data_files has no filename");
    }
    const std::string name = entry["filename"].get<std::string>();
    // A name, not a path: the state file must not lead the reader elsewhere.
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return bad(absl::StrCat("_data_files names '", name, "', which is not a file of the folder"));
    }
    files.push_back((folder / name).string());
  }
  if (files.empty()) return bad("_data_files is empty");
  return files;
}

// The folder's *.parquet files, by name.
absl::StatusOr<std::vector<std::string>> ParquetShards(const fs::path& folder) {
  std::vector<std::string> files;
  std::error_code ec;
  int entries = 0;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    if (++entries > kMaxFolderEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat(folder.string(), " holds more than ", kMaxFolderEntries, " entries"));
    }
    if (it->path().extension() == ".parquet") files.push_back(it->path().string());
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot list ", folder.string(), ": ", ec.message()));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListDataFiles(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (status.type() == fs::file_type::not_found) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  if (status.type() != fs::file_type::directory) return std::vector<std::string>{path};
  const fs::path folder(path);
  if (fs::exists(folder / "dataset_dict.json", ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " is a DatasetDict folder (it has dataset_dict.json): name one split's folder, "
        "such as ",
        (folder / "train").string()));
  }
  absl::StatusOr<std::vector<std::string>> files =
      fs::exists(folder / "state.json", ec) ? SavedDatasetFiles(folder) : ParquetShards(folder);
  if (!files.ok()) return files.status();
  if (files->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     " is a folder with no data: expected *.parquet shards, or a "
                     "datasets.save_to_disk folder (state.json and its *.arrow files)"));
  }
  return files;
}

}  // namespace ballast
