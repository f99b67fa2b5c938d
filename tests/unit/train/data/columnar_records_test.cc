// RecordReader over parquet and Arrow data sets (columnar_records.h): each
// file is written here with Arrow C++, read back as the records the JSONL
// path would parse, and every bad input refused naming file, column and row.
#include "worker/train/data/columnar_records.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/writer.h>
#include <arrow/json/from_string.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "worker/train/data/record_reader.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A table of one column per (name, type, JSON values).
struct Column {
  std::string name;
  std::shared_ptr<arrow::DataType> type;
  std::string values;
};

std::shared_ptr<arrow::Table> Table(const std::vector<Column>& columns) {
  arrow::FieldVector fields;
  arrow::ArrayVector arrays;
  for (const Column& c : columns) {
    fields.push_back(arrow::field(c.name, c.type));
    arrays.push_back(arrow::json::ArrayFromJSONString(c.type, c.values).ValueOrDie());
  }
  return arrow::Table::Make(arrow::schema(fields), arrays);
}

std::shared_ptr<arrow::DataType> Messages() {
  return arrow::list(
      arrow::struct_({arrow::field("role", arrow::utf8()), arrow::field("content", arrow::utf8()),
                      arrow::field("reasoning_content", arrow::utf8())}));
}

class ColumnarRecordsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "columnar_records_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string WriteParquet(const std::string& name, const std::shared_ptr<arrow::Table>& table,
                           int64_t row_group_rows = 2) {
    const std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
    EXPECT_TRUE(
        parquet::arrow::WriteTable(*table, arrow::default_memory_pool(), out, row_group_rows).ok());
    EXPECT_TRUE(out->Close().ok());
    return path;
  }

  // An Arrow IPC stream of record batches of `batch_rows`, as datasets writes.
  std::string WriteStream(const std::string& name, const std::shared_ptr<arrow::Table>& table,
                          int64_t batch_rows) {
    const std::string path = dir_ + "/" + name;
    fs::create_directories(fs::path(path).parent_path());
    auto out = arrow::io::FileOutputStream::Open(path).ValueOrDie();
    auto writer = arrow::ipc::MakeStreamWriter(out, table->schema()).ValueOrDie();
    EXPECT_TRUE(writer->WriteTable(*table, batch_rows).ok());
    EXPECT_TRUE(writer->Close().ok());
    EXPECT_TRUE(out->Close().ok());
    return path;
  }

  // Every record of `path` as JSON, or the first error.
  absl::StatusOr<std::vector<nlohmann::json>> ReadAll(const std::string& path,
                                                      const v1::DataColumns& columns = {}) {
    absl::StatusOr<std::unique_ptr<RecordReader>> reader =
        RecordReader::Open(path, {.max_line_bytes = 1 << 20, .columns = columns});
    if (!reader.ok()) return reader.status();
    std::vector<nlohmann::json> records;
    RawRecord raw;
    for (;;) {
      absl::StatusOr<bool> more = (*reader)->Next(&raw);
      if (!more.ok()) return more.status();
      if (!*more) return records;
      EXPECT_EQ(raw.index, static_cast<int64_t>(records.size()));
      absl::StatusOr<nlohmann::json> record = ParseRawRecord(raw);
      if (!record.ok()) {
        return absl::Status(record.status().code(), absl::StrCat((*reader)->Where(raw.index), ": ",
                                                                 record.status().message()));
      }
      records.push_back(*std::move(record));
    }
  }

  std::string dir_;
};

TEST_F(ColumnarRecordsTest, RowsBecomeTheRecordsOfTheirJsonlLines) {
  // A chat whose first message has no reasoning (null in the struct: left
  // out, as a JSONL message without the key), ids as int32, an unread column.
  const std::string path = WriteParquet(
      "chats.parquet", Table({{"messages", Messages(),
                               R"([[{"role": "user", "content": "hi", "reasoning_content": null},
                   {"role": "assistant", "content": "yo", "reasoning_content": "think"}],
                  [{"role": "user", "content": "2+2?", "reasoning_content": null}]])"},
                              {"input_ids", arrow::list(arrow::int32()), "[[1, 2, 3], []]"},
                              {"source", arrow::binary(), R"(["a", "b"])"}}));
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(path);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 2u);
  EXPECT_EQ((*records)[0], nlohmann::json::parse(R"({"messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "content": "yo", "reasoning_content": "think"}],
      "input_ids": [1, 2, 3]})"));
  EXPECT_EQ((*records)[1], nlohmann::json::parse(
                               R"({"messages": [{"role": "user", "content": "2+2?"}],
                                   "input_ids": []})"));
}

TEST_F(ColumnarRecordsTest, DataColumnsReadsKeysFromOtherColumns) {
  const std::string path =
      WriteParquet("qa.parquet", Table({{"question", arrow::utf8(), R"(["q1", "q2", "q3"])"},
                                        {"answer", arrow::large_utf8(), R"(["a1", "a2", "a3"])"},
                                        {"text", arrow::utf8(), R"(["t1", "t2", "t3"])"}}));
  v1::DataColumns columns;
  columns.set_prompt("question");
  columns.set_completion("answer");
  columns.set_text("no_such");  // a renamed key must have its column
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(path, columns);
  EXPECT_THAT(records.status().message(),
              AllOf(HasSubstr(path), HasSubstr("no column 'no_such'"),
                    HasSubstr("data.columns.text"), HasSubstr("question, answer, text")));
  columns.clear_text();
  records = ReadAll(path, columns);
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  EXPECT_EQ((*records)[2],
            nlohmann::json::parse(R"({"prompt": "q3", "completion": "a3", "text": "t3"})"));
}

TEST_F(ColumnarRecordsTest, ReadsMtebRerankingGroups) {
  // MTEB's scidocs-reranking: a query, lists of positive and negative documents.
  const std::string path =
      WriteParquet("scidocs.parquet",
                   Table({{"query", arrow::utf8(), R"(["apple"])"},
                          {"positive", arrow::list(arrow::utf8()), R"([["an apple a day"]])"},
                          {"negative", arrow::list(arrow::utf8()), R"([["river", "stone"]])"}}));
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(path);
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_EQ(records->at(0), nlohmann::json::parse(R"({"query": "apple",
      "positive": ["an apple a day"], "negative": ["river", "stone"]})"));
}

TEST_F(ColumnarRecordsTest, ANullNamesFileRowAndColumn) {
  // Rows 0..4 in row groups of 2: the null is row 3, in the second group.
  const std::string path = WriteParquet(
      "texts.parquet", Table({{"text", arrow::utf8(), R"(["a", "b", "c", null, "e"])"}}));
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(path);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(records.status().message(), path + ": row 3: column 'text' is null");
}

TEST_F(ColumnarRecordsTest, AColumnOfTheWrongTypeIsRefusedWhenOpened) {
  const std::string path = WriteParquet(
      "bad.parquet",
      Table({{"prompt", arrow::int64(), "[1]"}, {"completion", arrow::utf8(), R"(["x"])"}}));
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(path);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(records.status().message(),
              AllOf(HasSubstr(path), HasSubstr("column 'prompt'"), HasSubstr("is int64"),
                    HasSubstr("a string or a list of messages")));
  const std::string ids =
      WriteParquet("ids.parquet", Table({{"input_ids", arrow::list(arrow::utf8()), R"([["1"]])"}}));
  EXPECT_THAT(ReadAll(ids).status().message(),
              AllOf(HasSubstr("column 'input_ids'"), HasSubstr("a list of integers")));
}

TEST_F(ColumnarRecordsTest, AFileWithNoRecordKeyListsItsColumns) {
  const std::string path =
      WriteParquet("other.parquet", Table({{"question", arrow::utf8(), R"(["q"])"}}));
  EXPECT_THAT(ReadAll(path).status().message(),
              AllOf(HasSubstr(path), HasSubstr("none of its columns (question)"),
                    HasSubstr("data.columns")));
}

TEST_F(ColumnarRecordsTest, ACorruptFooterOrACutFileIsRefusedNamingTheFile) {
  std::string text = "[";
  for (int i = 0; i < 200; ++i) text += absl::StrCat(i ? ", " : "", "\"document ", i, "\"");
  const std::string path =
      WriteParquet("whole.parquet", Table({{"text", arrow::utf8(), text + "]"}}), 50);
  ASSERT_TRUE(ReadAll(path).ok());
  const uintmax_t size = fs::file_size(path);

  // The footer's length, in the last 8 bytes before the magic, made huge.
  const std::string corrupt = dir_ + "/corrupt.parquet";
  fs::copy_file(path, corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 8));
    f.write("\xff\xff\xff\x7f", 4);
  }
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(corrupt);
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(records.status().message(),
              AllOf(HasSubstr(corrupt), HasSubstr("not a readable parquet file")));

  // Cut anywhere: before the footer is a file without one.
  std::mt19937 rng(std::random_device{}());
  for (const uintmax_t keep : {size - 1, size / 2, uintmax_t{3},
                               std::uniform_int_distribution<uintmax_t>(1, size - 1)(rng)}) {
    const std::string cut = dir_ + "/cut.parquet";
    fs::copy_file(path, cut, fs::copy_options::overwrite_existing);
    fs::resize_file(cut, keep);
    records = ReadAll(cut);
    EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument) << keep;
    EXPECT_THAT(records.status().message(), HasSubstr(cut)) << keep;
  }
}

TEST_F(ColumnarRecordsTest, AFolderOfShardsIsReadInNameOrderAndErrorsNameTheShard) {
  WriteParquet("shards/part-001.parquet", Table({{"text", arrow::utf8(), R"(["c", null])"}}));
  WriteParquet("shards/part-000.parquet", Table({{"text", arrow::utf8(), R"(["a", "b"])"}}));
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(dir_ + "/shards");
  EXPECT_EQ(records.status().message(),
            dir_ + "/shards/part-001.parquet: row 1: column 'text' is null");
  WriteParquet("shards/part-001.parquet", Table({{"text", arrow::utf8(), R"(["c", "d"])"}}));
  records = ReadAll(dir_ + "/shards");
  ASSERT_TRUE(records.ok()) << records.status();
  std::vector<std::string> texts;
  for (const nlohmann::json& r : *records) texts.push_back(r["text"]);
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "b", "c", "d"}));
  // A shard whose columns give other keys would change the format midway.
  WriteParquet("shards/part-002.parquet",
               Table({{"input_ids", arrow::list(arrow::int64()), "[[1, 2]]"}}));
  EXPECT_THAT(ReadAll(dir_ + "/shards").status().message(),
              AllOf(HasSubstr("part-002.parquet"), HasSubstr("the record keys input_ids"),
                    HasSubstr("the first file's give text")));
}

TEST_F(ColumnarRecordsTest, ReadsADatasetsSaveToDiskFolder) {
  // save_to_disk's layout: data-0000K-of-0000N.arrow (IPC streams), state.json
  // listing them in order, dataset_info.json with the features.
  const std::string folder = dir_ + "/saved";
  WriteStream("saved/data-00001-of-00002.arrow",
              Table({{"text", arrow::large_utf8(), R"(["c", "d", "e"])"}}), 2);
  WriteStream("saved/data-00000-of-00002.arrow",
              Table({{"text", arrow::large_utf8(), R"(["a", "b"])"}}), 2);
  std::ofstream(folder + "/dataset_info.json")
      << R"({"features": {"text": {"dtype": "large_string", "_type": "Value"}}})";
  std::ofstream(folder + "/state.json")
      << R"({"_data_files": [{"filename": "data-00000-of-00002.arrow"},
                             {"filename": "data-00001-of-00002.arrow"}],
             "_fingerprint": "f", "_format_type": null, "_split": "train"})";
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(folder);
  ASSERT_TRUE(records.ok()) << records.status();
  std::vector<std::string> texts;
  for (const nlohmann::json& r : *records) texts.push_back(r["text"]);
  EXPECT_EQ(texts, (std::vector<std::string>{"a", "b", "c", "d", "e"}));

  // state.json may not lead the reader out of the folder.
  std::ofstream(folder + "/state.json") << R"({"_data_files": [{"filename": "../x.arrow"}]})";
  EXPECT_THAT(ReadAll(folder).status().message(),
              AllOf(HasSubstr("state.json"), HasSubstr("'../x.arrow'")));
  // A DatasetDict's folder holds splits: the user names one.
  std::ofstream(dir_ + "/dataset_dict.json") << R"({"splits": ["train"]})";
  EXPECT_THAT(ReadAll(dir_).status().message(), HasSubstr("name one split's folder"));
}

TEST_F(ColumnarRecordsTest, AFolderWithoutDataIsRefused) {
  fs::create_directories(dir_ + "/empty");
  std::ofstream(dir_ + "/empty/notes.txt") << "x";
  absl::StatusOr<std::vector<nlohmann::json>> records = ReadAll(dir_ + "/empty");
  EXPECT_EQ(records.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(records.status().message(), HasSubstr("a folder with no data"));
}

}  // namespace
}  // namespace ballast::train
