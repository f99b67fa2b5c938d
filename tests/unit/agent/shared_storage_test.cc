#include "worker/agent/shared_storage.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace ballast::agent {
namespace {

using ::testing::HasSubstr;

class SharedStorageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = "/tmp/ballast-shared-XXXXXX";
    root_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    std::string command = "rm -rf '" + root_ + "'";
    ASSERT_EQ(std::system(command.c_str()), 0);
  }
  std::string root_;
};

TEST_F(SharedStorageTest, NoFoldersOrPresentOnesAreFine) {
  EXPECT_TRUE(CheckSharedStorage({}).ok());
  EXPECT_TRUE(CheckSharedStorage({root_, "/tmp"}).ok());
}

TEST_F(SharedStorageTest, AMissingFolderIsNamedWithTheHint) {
  const absl::Status s = CheckSharedStorage({root_, root_ + "/models"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(),
              HasSubstr("shared storage " + root_ + "/models is missing on this node"));
  EXPECT_THAT(s.message(), HasSubstr("mount the shared storage at the same path"));
}

TEST_F(SharedStorageTest, AFileOrAFifoIsNotAFolder) {
  std::ofstream(root_ + "/file") << "x";
  EXPECT_THAT(CheckSharedStorage({root_ + "/file"}).message(), HasSubstr("is not a folder"));
  ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0600), 0);
  EXPECT_THAT(CheckSharedStorage({root_ + "/fifo"}).message(), HasSubstr("is not a folder"));
}

// A folder the worker cannot read: tests/deploy runs the worker image as
// uid 10001 against a root-owned folder (the tests here run as root).

}  // namespace
}  // namespace ballast::agent
