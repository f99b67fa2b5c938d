#include "worker/train/data/record_reader.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data_files.h"
#include "common/regular_file.h"
#include "worker/train/data/columnar_records.h"
#include "worker/train/data/data_format.h"

namespace ballast::train {
namespace {

// A record per non-blank line.
class JsonlRecords : public RecordReader {
 public:
  JsonlRecords(std::string path, LineReader lines)
      : path_(std::move(path)), lines_(std::move(lines)) {}

  absl::StatusOr<bool> Next(RawRecord* record) override {
    for (;;) {
      absl::StatusOr<bool> more = lines_.Next(&record->line);
      if (!more.ok() || !*more) return more;
      if (record->line.find_first_not_of(" \t\r") != std::string::npos) break;
    }
    record->index = lines_.line_number() - 1;
    record->batch.reset();
    return true;
  }

  std::string Where(int64_t index) const override { return absl::StrCat(path_, ":", index + 1); }

 private:
  std::string path_;
  LineReader lines_;
};

}  // namespace

absl::StatusOr<nlohmann::json> ParseRawRecord(const RawRecord& record) {
  return record.batch ? record.batch->Record(record.row) : ParseRecord(record.line);
}

absl::StatusOr<std::unique_ptr<RecordReader>> RecordReader::Open(
    const std::string& path, const RecordReaderOptions& options) {
  absl::StatusOr<std::vector<std::string>> files = ListDataFiles(path);
  if (!files.ok()) return files.status();
  const std::string ext = std::filesystem::path(files->front()).extension().string();
  if (ext == ".parquet" || ext == ".arrow") {
    return OpenColumnarRecords(*std::move(files), options.columns);
  }
  if (options.columns.ByteSizeLong() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.columns names the columns of parquet and Arrow data; ", path,
                     " is read as JSONL, whose records keep their keys"));
  }
  absl::StatusOr<LineReader> lines = LineReader::Open(path, options.max_line_bytes);
  if (!lines.ok()) return lines.status();
  return std::make_unique<JsonlRecords>(path, *std::move(lines));
}

}  // namespace ballast::train
