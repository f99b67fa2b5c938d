#include "common/job_spec_files.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/model_types.h"

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

TEST_F(JobSpecFilesTest, AConfigThatIsHugeOrAFifoIsRefusedAtOnce) {
  WriteConfig(std::string(2 << 20, ' '));
  absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model.path: "));
  EXPECT_THAT(s.message(), HasSubstr("is 2097152 bytes; at most 1048576"));
  fs::remove(dir_ / "model" / "config.json");
  ASSERT_EQ(mkfifo((dir_ / "model" / "config.json").c_str(), 0600), 0);
  s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("config.json is a FIFO"));
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
  EXPECT_THAT(s.message(), HasSubstr("data.seq_len = 1025 is out of range; allowed: 1..1024"));
  EXPECT_THAT(s.message(), HasSubstr((dir_ / "model" / "config.json").string()));
}

TEST_F(JobSpecFilesTest, AcceptsEverySupportedModelType) {
  for (absl::string_view model_type : kSupportedModelTypes) {
    WriteConfig(
        absl::StrCat(R"({"model_type": ")", model_type, R"(", "max_position_embeddings": 1024})"));
    EXPECT_TRUE(ValidateJobSpecFiles(spec_).ok())
        << model_type << ": " << ValidateJobSpecFiles(spec_);
  }
}

TEST_F(JobSpecFilesTest, UnsupportedModelTypeNamesTheFileAndTheAllowedTypes) {
  WriteConfig(R"({"model_type": "qwen3_moe", "max_position_embeddings": 1024})");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr((dir_ / "model" / "config.json").string()));
  EXPECT_THAT(s.message(), HasSubstr("model_type 'qwen3_moe'"));
  EXPECT_THAT(s.message(), HasSubstr("allowed: llama, qwen2, qwen3"));
}

TEST_F(JobSpecFilesTest, MissingModelTypeNamesTheAllowedTypes) {
  WriteConfig(R"({"max_position_embeddings": 1024})");
  const absl::Status s = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("no model_type"));
  EXPECT_THAT(s.message(), HasSubstr("allowed: llama, qwen2, qwen3"));
}

TEST_F(JobSpecFilesTest, ConfigWithoutMaxPositionEmbeddingsIsRefused) {
  WriteConfig(R"({"model_type": "qwen2", "max_position_embeddings": 0})");
  const absl::Status zero = ValidateJobSpecFiles(spec_);
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(zero.message(), HasSubstr("max_position_embeddings, a positive integer"));
  WriteConfig(R"({"model_type": "qwen2"})");
  EXPECT_THAT(ValidateJobSpecFiles(spec_).message(), HasSubstr("max_position_embeddings"));
}

TEST_F(JobSpecFilesTest, PrepareFillsDefaultsThenChecksRangesBeforeFiles) {
  spec_.mutable_optimizer()->set_lr(1e-4);
  spec_.set_max_steps(10);
  ASSERT_TRUE(PrepareJobSpec(&spec_).ok()) << PrepareJobSpec(&spec_);
  EXPECT_EQ(spec_.method(), "lora");
  EXPECT_EQ(spec_.lora().r(), 8);

  // Both a range and a file are wrong: the range is reported, as at submission.
  spec_.mutable_lora()->set_r(0);
  spec_.mutable_data()->set_path((dir_ / "nope.jsonl").string());
  const absl::Status s = PrepareJobSpec(&spec_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("lora.r = 0 is out of range"));

  spec_.mutable_lora()->set_r(8);
  EXPECT_THAT(PrepareJobSpec(&spec_).message(), HasSubstr("data.path"));
}

}  // namespace
}  // namespace ballast
