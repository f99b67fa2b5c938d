#include "common/job_spec_paths.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace ballast {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class JobSpecPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "ballast-paths-XXXXXX").string();
    dir_ = fs::canonical(mkdtemp(tmpl.data()));
    fs::create_directories(dir_ / "root" / "model");
    fs::create_directories(dir_ / "outside");
    std::ofstream(dir_ / "root" / "model" / "config.json") << "{}";
    std::ofstream(dir_ / "root" / "data.jsonl") << "{}\n";
    std::ofstream(dir_ / "outside" / "secret.jsonl") << "{}\n";
    spec_.mutable_model()->set_path((dir_ / "root" / "model").string());
    spec_.mutable_data()->set_path((dir_ / "root" / "data.jsonl").string());
    roots_ = {(dir_ / "root").string()};
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  v1::JobSpec spec_;
  std::vector<std::string> roots_;
};

TEST_F(JobSpecPathsTest, RelativePathsBecomeAbsoluteAgainstTheSubmittersFolder) {
  v1::JobSpec spec;
  spec.mutable_model()->set_path("build/tiny/model");
  spec.mutable_data()->set_path("../data/./chats.jsonl");
  spec.mutable_lora()->set_init_adapter("/adapters/a");
  MakeSpecPathsAbsolute("/home/ada/work", &spec);
  EXPECT_EQ(spec.model().path(), "/home/ada/work/build/tiny/model");
  EXPECT_EQ(spec.data().path(), "/home/ada/data/chats.jsonl");
  EXPECT_EQ(spec.lora().init_adapter(), "/adapters/a");
  EXPECT_TRUE(spec.data().tokenizer().empty());
  // A path field in an unset message leaves it unset: a reranker block is
  // refused for other tasks.
  EXPECT_FALSE(spec.has_reranker());
  EXPECT_TRUE(CheckSpecPaths(spec, {}).ok()) << CheckSpecPaths(spec, {});
}

TEST_F(JobSpecPathsTest, WithoutRootsAnyAbsolutePathIsAllowedAndARelativeOneNever) {
  spec_.mutable_data()->set_path((dir_ / "outside" / "secret.jsonl").string());
  EXPECT_TRUE(CheckSpecPaths(spec_, {}).ok());
  spec_.mutable_reranker()->set_eval_path("held-out.jsonl");
  const absl::Status s = CheckSpecPaths(spec_, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("reranker.eval_path: 'held-out.jsonl' is relative"));
}

TEST_F(JobSpecPathsTest, RootsConfineEveryPathPastDotDotAndSymlinks) {
  EXPECT_TRUE(CheckSpecPaths(spec_, roots_).ok()) << CheckSpecPaths(spec_, roots_);

  // A sibling whose name starts like the root is not inside it.
  fs::create_directories(dir_ / "root-b");
  std::ofstream(dir_ / "root-b" / "d.jsonl") << "{}\n";
  spec_.mutable_data()->set_path((dir_ / "root-b" / "d.jsonl").string());
  absl::Status s = CheckSpecPaths(spec_, roots_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("data.path: "));
  EXPECT_THAT(s.message(), HasSubstr("is outside the path roots " + roots_[0]));

  spec_.mutable_data()->set_path((dir_ / "root" / ".." / "outside" / "secret.jsonl").string());
  s = CheckSpecPaths(spec_, roots_);
  EXPECT_THAT(s.message(),
              HasSubstr("which resolves to " + (dir_ / "outside" / "secret.jsonl").string()));

  fs::create_symlink(dir_ / "outside" / "secret.jsonl", dir_ / "root" / "link.jsonl");
  spec_.mutable_data()->set_path((dir_ / "root" / "link.jsonl").string());
  EXPECT_THAT(CheckSpecPaths(spec_, roots_).message(), HasSubstr("is outside the path roots"));

  // A file of the model folder that links out is an escape as well.
  spec_.mutable_data()->set_path((dir_ / "root" / "data.jsonl").string());
  fs::create_symlink(dir_ / "outside" / "secret.jsonl",
                     dir_ / "root" / "model" / "model.safetensors");
  s = CheckSpecPaths(spec_, roots_);
  EXPECT_THAT(s.message(), HasSubstr("model.path entry: "));
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));

  // Any of several roots will do.
  roots_.push_back((dir_ / "outside").string());
  EXPECT_TRUE(CheckSpecPaths(spec_, roots_).ok()) << CheckSpecPaths(spec_, roots_);
}

TEST_F(JobSpecPathsTest, AShardOfADataFolderThatLinksOutIsAnEscape) {
  fs::create_directories(dir_ / "root" / "shards");
  std::ofstream(dir_ / "root" / "shards" / "part-0.parquet") << "PAR1";
  spec_.mutable_data()->set_path((dir_ / "root" / "shards").string());
  EXPECT_TRUE(CheckSpecPaths(spec_, roots_).ok()) << CheckSpecPaths(spec_, roots_);
  fs::create_symlink(dir_ / "outside" / "secret.jsonl",
                     dir_ / "root" / "shards" / "part-1.parquet");
  const absl::Status s = CheckSpecPaths(spec_, roots_);
  EXPECT_THAT(s.message(), HasSubstr("data.path entry: "));
  EXPECT_THAT(s.message(), HasSubstr("part-1.parquet"));
  EXPECT_THAT(s.message(), HasSubstr("is outside the path roots"));
  // And so is a folder of another tenant's job, in ballastd's output folder.
  fs::create_directories(dir_ / "root" / "jobs" / "j-1" / "shards");
  std::ofstream(dir_ / "root" / "jobs" / "j-1" / "shards" / "part-0.parquet") << "PAR1";
  spec_.mutable_data()->set_path((dir_ / "root" / "jobs" / "j-1" / "shards").string());
  const auto mine = [](const std::string& job) { return job == "j-2"; };
  const absl::Status other =
      CheckPathsOutsideOtherJobs(spec_, (dir_ / "root" / "jobs").string(), mine);
  EXPECT_THAT(other.message(), HasSubstr("data.path: "));
  EXPECT_THAT(other.message(), HasSubstr("outside any job of yours"));
}

TEST_F(JobSpecPathsTest, ResolvingReplacesEachPathWithWhereItLeadsNow) {
  // A link from outside into the root passes the check, by where it leads;
  // the rank then opens that, not the link, which may change later.
  fs::create_symlink(dir_ / "root" / "model", dir_ / "outside" / "model-link");
  spec_.mutable_model()->set_path((dir_ / "outside" / "model-link").string());
  spec_.mutable_data()->set_path((dir_ / "root" / "model" / ".." / "data.jsonl").string());
  ASSERT_TRUE(CheckSpecPaths(spec_, roots_).ok()) << CheckSpecPaths(spec_, roots_);
  ResolveSpecPaths(&spec_);
  EXPECT_EQ(spec_.model().path(), (dir_ / "root" / "model").string());
  EXPECT_EQ(spec_.data().path(), (dir_ / "root" / "data.jsonl").string());
  EXPECT_TRUE(spec_.lora().init_adapter().empty() && !spec_.has_reranker());
}

TEST_F(JobSpecPathsTest, ARootMustBeAnAbsoluteExistingFolder) {
  EXPECT_TRUE(CheckPathRoots(roots_).ok());
  EXPECT_TRUE(CheckPathRoots({}).ok());
  for (const std::string& bad : {std::string("relative/root"), (dir_ / "missing").string(),
                                 (dir_ / "root" / "data.jsonl").string()}) {
    const absl::Status s = CheckPathRoots({bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("--path-root " + bad + ": not an absolute path"));
  }
}

}  // namespace
}  // namespace ballast
