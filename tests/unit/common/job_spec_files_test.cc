#include "common/job_spec_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace ballast {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class JobSpecFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ballast-spec-XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    fs::create_directories(dir_ / "model");
    WriteConfig(R"({"model_type": "llama", "max_position_embeddings": 1024})");
    std::ofstream(dir_ / "data.jsonl") << "{\"input_ids\": [1]}\n";
    spec_.mutable_model()->set_path((dir_ / "model").string());
    spec_.mutable_data()->set_path((dir_ / "data.jsonl").string());
    spec_.mutable_data()->set_seq_len(1024);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void WriteConfig(const std::string& text) {
    std::ofstream(dir_ / "model" / "config.json") << text;
  }

  fs::path dir_;
  v1::JobSpec spec_;
};

TEST_F(JobSpecFilesTest, AcceptsASpecWhoseFilesExistAndFit) {
  EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok()) << ValidateJobSpecFiles(spec_);
}

TEST_F(JobSpecFilesTest, MissingConfigNamesModelPath) {
  fs::remove(dir_ / "model" / "config.json");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.path"));
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST_F(JobSpecFilesTest, MalformedConfigIsInvalidArgument) {
  WriteConfig("{\"max_position_embeddings\": ");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("not valid JSON"));
}

TEST_F(JobSpecFilesTest, MissingDataNamesDataPath) {
  spec_.mutable_data()->set_path((dir_ / "nope.jsonl").string());
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.path"));
}

TEST_F(JobSpecFilesTest, SeqLenAboveMaxPositionEmbeddingsNamesTheRange) {
  spec_.mutable_data()->set_seq_len(1025);
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.seq_len"));
  EXPECT_THAT(s.message(), HasSubstr("1..1024"));
}

}  // namespace
}  // namespace ballast
