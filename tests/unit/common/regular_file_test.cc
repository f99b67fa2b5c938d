#include "common/regular_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ballast {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class RegularFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "regular_file.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  std::string Write(const std::string& name, const std::string& text) const {
    std::ofstream(Path(name), std::ios::binary) << text;
    return Path(name);
  }

  std::string dir_;
};

TEST_F(RegularFileTest, ReadsASmallFileWhole) {
  absl::StatusOr<std::string> text = ReadRegularFile(Write("a.json", "{\"x\": 1}"), 100);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "{\"x\": 1}");
}

TEST_F(RegularFileTest, RefusesWhatIsMissingTooLargeOrNotARegularFile) {
  EXPECT_EQ(ReadRegularFile(Path("missing"), 100).status().code(), absl::StatusCode::kNotFound);
  const absl::Status big = ReadRegularFile(Write("big", std::string(101, 'x')), 100).status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("is 101 bytes; at most 100"));
  EXPECT_THAT(ReadRegularFile(dir_, 100).status().message(), HasSubstr("is a directory"));
  // A FIFO with no writer: opening it to read would block forever.
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THAT(ReadRegularFile(Path("fifo"), 100).status().message(),
              HasSubstr("fifo is a FIFO; a regular file is needed"));
  EXPECT_THAT(LineReader::Open(Path("fifo"), 100).status().message(), HasSubstr("is a FIFO"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST_F(RegularFileTest, LinesComeOneAtATimeWithTheirNumbers) {
  const std::string path = Write("lines", "a\n\nccc\nlast without newline");
  absl::StatusOr<LineReader> reader = LineReader::Open(path, 100);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<std::string> lines;
  std::string line;
  for (;;) {
    absl::StatusOr<bool> more = reader->Next(&line);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    lines.push_back(line);
  }
  EXPECT_THAT(lines, ::testing::ElementsAre("a", "", "ccc", "last without newline"));
  EXPECT_EQ(reader->line_number(), 4);
}

TEST_F(RegularFileTest, ALineLongerThanTheLimitIsAnErrorNamingItsNumber) {
  // Longer than one read chunk, so the limit holds across refills.
  const std::string path = Write("long", "ok\n" + std::string(200000, 'x') + "\nafter\n");
  absl::StatusOr<LineReader> reader = LineReader::Open(path, 1000);
  ASSERT_TRUE(reader.ok());
  std::string line;
  ASSERT_TRUE(*reader->Next(&line));
  const absl::StatusOr<bool> second = reader->Next(&line);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(second.status().message(), HasSubstr("long:2: the line is longer than 1000 bytes"));
}

}  // namespace
}  // namespace ballast
