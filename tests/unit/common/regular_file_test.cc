#include "common/regular_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

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
  void TearDown() override {
    ConfineOpensBeneath({});  // a failed assertion may leave the process confined
    fs::remove_all(dir_);
  }

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

// Issue 33: /proc/self/mem is "regular", of size 0, and its read fails with
// EIO, which the trainer took for a fault a restart could fix.
TEST_F(RegularFileTest, FilesOfTheKernelsPseudoFileSystemsAreRefusedAtOpen) {
  for (const char* path : {"/proc/self/mem", "/proc/self/status", "/proc/self/environ"}) {
    const absl::Status s = CheckRegularFile(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(s.message(), HasSubstr(std::string(path) + " is a file of the kernel's proc file "
                                                           "system, made up as it is read"));
    EXPECT_EQ(LineReader::Open(path, 100).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ReadRegularFile(path, 100).status().code(), absl::StatusCode::kInvalidArgument);
  }
  if (fs::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    EXPECT_THAT(CheckRegularFile("/sys/kernel/mm/transparent_hugepage/enabled").message(),
                HasSubstr("the kernel's sysfs file system"));
  }
}

// EACCES at open is a bad input (INVALID_ARGUMENT, exit 2), not a fault to
// retry. Root opens any file, so a child that is not root tries it.
TEST_F(RegularFileTest, AFileThatCannotBeOpenedIsABadInput) {
  const std::string path = Write("secret", "{}\n");
  ASSERT_EQ(chmod(path.c_str(), 0), 0);
  ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(3);
    const absl::Status s = CheckRegularFile(path);
    _exit(s.code() != absl::StatusCode::kInvalidArgument                 ? 1
          : s.message() != "cannot open " + path + ": Permission denied" ? 2
                                                                         : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not INVALID_ARGUMENT, 2: another message, 3: setuid";
}

// A file that grows as it is read ends where it ended when it was opened, and
// the change is an error: the lines read may mix two versions of the file.
TEST_F(RegularFileTest, AFileThatChangesWhileItIsReadIsAnError) {
  const std::string line = "{\"text\": \"" + std::string(1000, 'x') + "\"}\n";
  std::string text;
  for (int i = 0; i < 200; ++i) text += line;  // 3 chunks of the reader
  const std::string path = Write("grows", text);
  absl::StatusOr<LineReader> reader = LineReader::Open(path, 2000);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::ofstream(path, std::ios::app) << line << line;
  std::string got;
  int lines = 0;
  absl::StatusOr<bool> more;
  while ((more = reader->Next(&got)).ok() && *more) ++lines;
  EXPECT_EQ(lines, 200);
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(more.status().message(),
              HasSubstr("grows changed while it was read: 202600 bytes when it was opened, "
                        "204626 now"));

  reader = LineReader::Open(path, 2000);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(*reader->Next(&got));
  ASSERT_EQ(truncate(path.c_str(), 1000), 0);
  while ((more = reader->Next(&got)).ok() && *more) {
  }
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(more.status().message(),
              HasSubstr("204626 bytes when it was opened, only 65536 could be read, 1000 now"));
}

TEST_F(RegularFileTest, ConfinedOpensAreJudgedByTheFileOpenedNotByThePath) {
  const fs::path root = fs::path(dir_) / "root", outside = fs::path(dir_) / "outside";
  fs::create_directories(root);
  fs::create_directories(outside);
  const std::string inside = Write("root/config.json", "{}");
  const std::string secret = Write("outside/secret.json", "{\"key\": 1}");
  fs::create_symlink(inside, root / "absolute-link-inside.json");
  fs::create_symlink(secret, root / "escape.json");
  fs::create_symlink(outside, root / "escape-folder");
  fs::create_symlink(root, fs::path(dir_) / "root-alias");
  // A symlink that pointed inside when the paths were checked, swapped for
  // one that points out before the file is opened.
  fs::create_symlink(inside, root / "data.json");
  fs::create_symlink(secret, root / "data.json.next");
  fs::rename(root / "data.json.next", root / "data.json");

  ConfineOpensBeneath({root.string()});
  EXPECT_TRUE(ReadRegularFile(inside, 100).ok());
  EXPECT_TRUE(ReadRegularFile((root / "absolute-link-inside.json").string(), 100).ok());
  for (const fs::path& path :
       {root / "escape.json", root / "escape-folder" / "secret.json", root / "data.json"}) {
    const absl::Status s = ReadRegularFile(path.string(), 100).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_THAT(s.message(), HasSubstr(path.string() + " leads to " + secret +
                                       ", outside the path roots " + root.string()));
    EXPECT_FALSE(CheckRegularFile(path.string()).ok()) << path;
    EXPECT_FALSE(LineReader::Open(path.string(), 100).ok()) << path;
  }
  // The job's own folders lie outside every root and open as before.
  EXPECT_TRUE(ReadRegularFile(secret, 100).ok());

  // A root given through a symlink confines the paths written either way.
  ConfineOpensBeneath({(fs::path(dir_) / "root-alias").string()});
  EXPECT_TRUE(ReadRegularFile((fs::path(dir_) / "root-alias" / "config.json").string(), 100).ok());
  EXPECT_FALSE(ReadRegularFile((fs::path(dir_) / "root-alias" / "escape.json").string(), 100).ok());
  EXPECT_FALSE(ReadRegularFile((root / "escape.json").string(), 100).ok());

  ConfineOpensBeneath({});
  EXPECT_TRUE(ReadRegularFile((root / "escape.json").string(), 100).ok());
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

TEST_F(RegularFileTest, ZstdFilesAreReadAsTheirTextAndDamageIsAnError) {
  // Many lines across several frames, longer than the reader's chunks.
  std::string text, compressed;
  for (int i = 0; i < 20000; ++i) text += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  for (size_t at = 0; at < text.size(); at += 100000) {
    const std::string part = text.substr(at, 100000);
    std::string frame(ZSTD_compressBound(part.size()), '\0');
    frame.resize(ZSTD_compress(frame.data(), frame.size(), part.data(), part.size(), 3));
    compressed += frame;
  }
  const std::string path = Write("data.jsonl.zst", compressed);
  absl::StatusOr<LineReader> reader = LineReader::Open(path, 100);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::string line, read;
  for (;;) {
    absl::StatusOr<bool> more = reader->Next(&line);
    ASSERT_TRUE(more.ok()) << more.status();
    if (!*more) break;
    read += line + "\n";
  }
  EXPECT_EQ(read, text);
  EXPECT_EQ(reader->line_number(), 20000);

  // Cut short in the middle of a frame, or not zstd at all.
  for (const std::string& bad :
       {compressed.substr(0, compressed.size() / 2), std::string("plain text, not zstd\n")}) {
    absl::StatusOr<LineReader> damaged = LineReader::Open(Write("bad.jsonl.zst", bad), 1 << 20);
    ASSERT_TRUE(damaged.ok());
    absl::Status status;
    for (;;) {
      absl::StatusOr<bool> more = damaged->Next(&line);
      if (!more.ok() || !*more) {
        status = more.status();
        break;
      }
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(status.message(), HasSubstr("bad.jsonl.zst: "));
  }
}

}  // namespace
}  // namespace ballast
