#include "worker/train/data/columnar_records.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/regular_file.h"
#include "worker/train/data/data_format.h"

namespace ballast::train {
namespace {

bool IsString(const arrow::DataType& t) {
  return t.id() == arrow::Type::STRING || t.id() == arrow::Type::LARGE_STRING ||
         t.id() == arrow::Type::STRING_VIEW;
}

bool IsList(const arrow::DataType& t) {
  return t.id() == arrow::Type::LIST || t.id() == arrow::Type::LARGE_LIST ||
         t.id() == arrow::Type::FIXED_SIZE_LIST;
}

// The element type of a list type, or null.
const arrow::DataType* ElementOf(const arrow::DataType& t) {
  return IsList(t) ? static_cast<const arrow::BaseListType&>(t).value_type().get() : nullptr;
}

bool IsListOf(const arrow::DataType& t, bool (*element)(const arrow::DataType&)) {
  const arrow::DataType* e = ElementOf(t);
  return e != nullptr && element(*e);
}

bool IsMessages(const arrow::DataType& t) {
  return IsListOf(t, [](const arrow::DataType& e) { return e.id() == arrow::Type::STRUCT; });
}

// What a key's column must hold, in the record formats' words; false when
// its type cannot be that.
struct KeyShape {
  const char* what;
  bool (*fits)(const arrow::DataType&);
};

KeyShape ShapeOf(absl::string_view key) {
  const auto string_or_strings = [](const arrow::DataType& t) {
    return IsString(t) || IsListOf(t, IsString);
  };
  if (key == "messages") return {"a list of messages (structs of role and content)", IsMessages};
  if (key == "prompt" || key == "completion") {
    return {"a string or a list of messages (structs of role and content)",
            [](const arrow::DataType& t) { return IsString(t) || IsMessages(t); }};
  }
  if (key == "input_ids" || key == "labels") {
    return {"a list of integers", [](const arrow::DataType& t) {
              return IsListOf(t,
                              [](const arrow::DataType& e) { return arrow::is_integer(e.id()); });
            }};
  }
  if (key == "positive_messages" || key == "negative_messages") {
    return {"a list of lists of messages", [](const arrow::DataType& t) {
              return IsListOf(t, [](const arrow::DataType& e) { return IsMessages(e); });
            }};
  }
  if (key == "text" || key == "query" || key == "response") return {"a string", IsString};
  return {"a string or a list of strings", string_or_strings};
}

// Element `i` of `array`, not null, as JSON; a struct leaves its null fields out.
nlohmann::json ValueJson(const arrow::Array& array, int64_t i);

template <typename ListArrayType>
nlohmann::json ListJson(const arrow::Array& array, int64_t i) {
  const auto& list = static_cast<const ListArrayType&>(array);
  const arrow::Array& values = *list.values();
  nlohmann::json out = nlohmann::json::array();
  const int64_t begin = list.value_offset(i);
  for (int64_t k = begin; k < begin + list.value_length(i); ++k) {
    out.push_back(values.IsNull(k) ? nlohmann::json(nullptr) : ValueJson(values, k));
  }
  return out;
}

template <typename ArrayType>
auto At(const arrow::Array& array, int64_t i) {
  return static_cast<const ArrayType&>(array).Value(i);
}

nlohmann::json ValueJson(const arrow::Array& array, int64_t i) {
  switch (array.type_id()) {
    case arrow::Type::STRING:
      return std::string(static_cast<const arrow::StringArray&>(array).GetView(i));
    case arrow::Type::LARGE_STRING:
      return std::string(static_cast<const arrow::LargeStringArray&>(array).GetView(i));
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(array).GetView(i));
    case arrow::Type::BOOL:
      return At<arrow::BooleanArray>(array, i);
    case arrow::Type::INT8:
      return At<arrow::Int8Array>(array, i);
    case arrow::Type::INT16:
      return At<arrow::Int16Array>(array, i);
    case arrow::Type::INT32:
      return At<arrow::Int32Array>(array, i);
    case arrow::Type::INT64:
      return At<arrow::Int64Array>(array, i);
    case arrow::Type::UINT8:
      return At<arrow::UInt8Array>(array, i);
    case arrow::Type::UINT16:
      return At<arrow::UInt16Array>(array, i);
    case arrow::Type::UINT32:
      return At<arrow::UInt32Array>(array, i);
    case arrow::Type::UINT64:
      return At<arrow::UInt64Array>(array, i);
    case arrow::Type::FLOAT:
      return At<arrow::FloatArray>(array, i);
    case arrow::Type::DOUBLE:
      return At<arrow::DoubleArray>(array, i);
    case arrow::Type::LIST:
      return ListJson<arrow::ListArray>(array, i);
    case arrow::Type::LARGE_LIST:
      return ListJson<arrow::LargeListArray>(array, i);
    case arrow::Type::FIXED_SIZE_LIST:
      return ListJson<arrow::FixedSizeListArray>(array, i);
    case arrow::Type::STRUCT: {
      const auto& s = static_cast<const arrow::StructArray&>(array);
      nlohmann::json out = nlohmann::json::object();
      for (int f = 0; f < s.num_fields(); ++f) {
        const std::shared_ptr<arrow::Array> field = s.field(f);
        if (!field->IsNull(i)) out[s.struct_type()->field(f)->name()] = ValueJson(*field, i);
      }
      return out;
    }
    default:
      // ShapeOf admits no other type where a value is read; a struct's
      // other fields (a message's "weight": binary) come out null.
      return nullptr;
  }
}

// A column read: the record key it fills and its name in the file.
struct ReadColumn {
  std::string key;
  std::string name;
  int field = 0;  // in the file's schema
};

// The columns of `schema` that records read, checked against their keys.
absl::StatusOr<std::vector<ReadColumn>> ChooseColumns(const std::string& file,
                                                      const arrow::Schema& schema,
                                                      const v1::DataColumns& columns) {
  const google::protobuf::Descriptor* d = columns.GetDescriptor();
  const google::protobuf::Reflection* r = columns.GetReflection();
  std::vector<ReadColumn> read;
  for (const char* key : kRecordKeys) {
    const google::protobuf::FieldDescriptor* f = d->FindFieldByName(key);
    const std::string renamed = f != nullptr ? r->GetString(columns, f) : "";
    const std::string name = renamed.empty() ? key : renamed;
    const int field = schema.GetFieldIndex(name);
    if (field < 0) {
      if (renamed.empty()) continue;
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": no column '", renamed, "', which data.columns.", key,
                       " names; its columns: ", absl::StrJoin(schema.field_names(), ", ")));
    }
    const KeyShape shape = ShapeOf(key);
    const arrow::DataType& type = *schema.field(field)->type();
    if (!shape.fits(type)) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": column '", name, "' (record key ",
                                                     key, ") is ", type.ToString(), "; ", key,
                                                     " must be ", shape.what));
    }
    read.push_back({key, name, field});
  }
  if (read.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": none of its columns (", absl::StrJoin(schema.field_names(), ", "),
        ") is a record key (messages, prompt + completion, text, input_ids, query + positive + "
        "negative); data.columns names the column of a key"));
  }
  return read;
}

class ArrowRowBatch : public RowBatch {
 public:
  ArrowRowBatch(std::shared_ptr<arrow::RecordBatch> batch,
                std::shared_ptr<const std::vector<ReadColumn>> columns)
      : batch_(std::move(batch)), columns_(std::move(columns)) {
    // A row group's table holds only the columns read, so positions differ
    // from the file's; names do not.
    for (const ReadColumn& c : *columns_) arrays_.push_back(batch_->GetColumnByName(c.name).get());
  }

  absl::StatusOr<nlohmann::json> Record(int64_t row) const override {
    nlohmann::json record = nlohmann::json::object();
    for (size_t c = 0; c < arrays_.size(); ++c) {
      const ReadColumn& column = (*columns_)[c];
      if (arrays_[c]->IsNull(row)) {
        return absl::InvalidArgumentError(absl::StrCat("column '", column.name, "' is null"));
      }
      record[column.key] = ValueJson(*arrays_[c], row);
    }
    return record;
  }

 private:
  std::shared_ptr<arrow::RecordBatch> batch_;
  std::shared_ptr<const std::vector<ReadColumn>> columns_;
  std::vector<const arrow::Array*> arrays_;  // batch_'s, one per column read
};

// Where a file's rows begin in the count over all files.
struct FileStart {
  int64_t first_index;
  std::string path;
};

absl::Status Named(const std::string& file, absl::string_view what, const arrow::Status& s) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what, s.message()));
}

class ColumnarRecords : public RecordReader {
 public:
  ColumnarRecords(std::vector<std::string> files, const v1::DataColumns& columns)
      : files_(std::move(files)), columns_(columns) {}

  absl::Status OpenNextFile() {
    parquet_.reset();
    stream_.reset();
    table_batches_.reset();
    table_.reset();
    const std::string& path = files_[next_file_++];
    starts_.push_back({next_index_, path});
    // Opened as every user file is (common/regular_file.h: no FIFO, no
    // pseudo file, under the path roots); Arrow owns the descriptor then.
    absl::StatusOr<OpenedFile> opened = OpenRegularFile(path);
    if (!opened.ok()) return absl::InvalidArgumentError(opened.status().message());
    arrow::Result<std::shared_ptr<arrow::io::ReadableFile>> file =
        arrow::io::ReadableFile::Open(opened->fd);
    if (!file.ok()) return Named(path, "cannot read: ", file.status());
    std::shared_ptr<arrow::Schema> schema;
    if (path.ends_with(".parquet")) {
      arrow::Result<std::unique_ptr<parquet::arrow::FileReader>> reader =
          parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
      if (!reader.ok()) return Named(path, "not a readable parquet file: ", reader.status());
      if (arrow::Status s = (*reader)->GetSchema(&schema); !s.ok()) {
        return Named(path, "not a readable parquet file: ", s);
      }
      parquet_ = *std::move(reader);
      next_row_group_ = 0;
    } else {
      arrow::Result<std::shared_ptr<arrow::ipc::RecordBatchStreamReader>> reader =
          arrow::ipc::RecordBatchStreamReader::Open(
              std::static_pointer_cast<arrow::io::InputStream>(*file));
      if (!reader.ok()) return Named(path, "not an Arrow IPC stream: ", reader.status());
      schema = (*reader)->schema();
      stream_ = *std::move(reader);
    }
    absl::StatusOr<std::vector<ReadColumn>> read = ChooseColumns(path, *schema, columns_);
    if (!read.ok()) return read.status();
    // Every shard's records must have the same keys, or the first shard's
    // format would meet other records later.
    if (read_ != nullptr && KeysOf(*read) != KeysOf(*read_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": its columns give the record keys ", KeysOf(*read), ", the first file's give ",
          KeysOf(*read_), "; every file of a data set has the same columns"));
    }
    read_ = std::make_shared<const std::vector<ReadColumn>>(*std::move(read));
    if (parquet_) {
      // The parquet leaf columns of the fields read, and no others.
      leaves_.clear();
      for (const ReadColumn& c : *read_) AddLeaves(parquet_->manifest().schema_fields[c.field]);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<bool> Next(RawRecord* record) override {
    try {
      while (batch_ == nullptr || row_ == batch_rows_) {
        absl::StatusOr<bool> more = NextBatch();
        if (!more.ok() || !*more) return more;
      }
    } catch (const std::exception& e) {
      // parquet throws ParquetException from a few of its readers' paths.
      return absl::InvalidArgumentError(absl::StrCat(starts_.back().path, ": ", e.what()));
    }
    record->index = next_index_++;
    record->batch = batch_;
    record->row = row_++;
    record->line.clear();
    return true;
  }

  std::string Where(int64_t index) const override {
    auto it = std::upper_bound(starts_.begin(), starts_.end(), index,
                               [](int64_t i, const FileStart& s) { return i < s.first_index; });
    const FileStart& start = *std::prev(it);
    return absl::StrCat(start.path, ": row ", index - start.first_index);
  }

 private:
  static std::string KeysOf(const std::vector<ReadColumn>& read) {
    return absl::StrJoin(read, ", ",
                         [](std::string* out, const ReadColumn& c) { out->append(c.key); });
  }

  void AddLeaves(const parquet::arrow::SchemaField& field) {
    if (field.is_leaf()) leaves_.push_back(field.column_index);
    for (const parquet::arrow::SchemaField& child : field.children) AddLeaves(child);
  }

  // The next record batch with rows into batch_: of the row group read, the
  // next row group, the stream, or the next file. False after the last.
  absl::StatusOr<bool> NextBatch() {
    const std::string& path = starts_.empty() ? files_.front() : starts_.back().path;
    std::shared_ptr<arrow::RecordBatch> batch;
    if (table_batches_) {
      if (arrow::Status s = table_batches_->ReadNext(&batch); !s.ok()) return Named(path, "", s);
    } else if (parquet_ && next_row_group_ < parquet_->num_row_groups()) {
      const int group = next_row_group_++;
      arrow::Result<std::shared_ptr<arrow::Table>> table = parquet_->ReadRowGroup(group, leaves_);
      if (!table.ok()) return Named(path, absl::StrCat("row group ", group, ": "), table.status());
      table_ = *std::move(table);
      table_batches_ = std::make_unique<arrow::TableBatchReader>(*table_);
      return NextBatch();
    } else if (stream_) {
      if (arrow::Status s = stream_->ReadNext(&batch); !s.ok()) {
        return Named(path,
                     absl::StrCat("the record batch after row ",
                                  next_index_ - starts_.back().first_index, ": "),
                     s);
      }
    }
    if (batch == nullptr) {
      if (table_batches_) {
        table_batches_.reset();
        table_.reset();
        return NextBatch();
      }
      if (next_file_ == files_.size()) return false;
      if (absl::Status s = OpenNextFile(); !s.ok()) return s;
      return NextBatch();
    }
    batch_ = std::make_shared<ArrowRowBatch>(batch, read_);
    batch_rows_ = batch->num_rows();
    row_ = 0;
    return true;
  }

  const std::vector<std::string> files_;
  const v1::DataColumns columns_;
  size_t next_file_ = 0;
  std::vector<FileStart> starts_;
  int64_t next_index_ = 0;
  // The current file's; batches keep their file's.
  std::shared_ptr<const std::vector<ReadColumn>> read_;

  std::unique_ptr<parquet::arrow::FileReader> parquet_;
  std::vector<int> leaves_;
  int next_row_group_ = 0;
  std::shared_ptr<arrow::Table> table_;
  std::unique_ptr<arrow::TableBatchReader> table_batches_;
  std::shared_ptr<arrow::ipc::RecordBatchStreamReader> stream_;

  std::shared_ptr<const RowBatch> batch_;
  int64_t batch_rows_ = 0;
  int64_t row_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<RecordReader>> OpenColumnarRecords(std::vector<std::string> files,
                                                                  const v1::DataColumns& columns) {
  auto reader = std::make_unique<ColumnarRecords>(std::move(files), columns);
  // The first file now, so that a bad one fails the open, not the first read.
  try {
    if (absl::Status s = reader->OpenNextFile(); !s.ok()) return s;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return reader;
}

}  // namespace ballast::train
