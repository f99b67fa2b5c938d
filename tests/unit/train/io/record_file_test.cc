#include "worker/train/io/record_file.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include "absl/strings/escaping.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

// The check value of the CRC-32C catalogue entry (iSCSI, RFC 3720).
TEST(Crc32cTest, MatchesTheCatalogueCheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

// RFC 3720, appendix B.4: 32 bytes of zeros, of ones, ascending, descending.
TEST(Crc32cTest, MatchesRfc3720Vectors) {
  std::string zeros(32, '\0'), ones(32, '\xff'), ascending(32, '\0'), descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

// The values TensorBoard's own masked_crc32c gives (tensorboard 2.21.0,
// compat/tensorflow_stub/pywrap_tensorflow.py), which also follow from the
// mask's definition by hand: rotr15(0xE3069283) + 0xa282ead8 = 0xC78AB0E5.
TEST(Crc32cTest, MasksAsTfRecordDoes) {
  EXPECT_EQ(MaskedCrc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(MaskedCrc32c(""), 0xa282ead8u);
  EXPECT_EQ(MaskedCrc32c(std::string(8, '\0')), 0x07980329u);
}

// The bytes of TensorBoard's RecordWriter (summary/writer/record_writer.py)
// for the record "brain.Event:2".
TEST(FrameRecordTest, EqualsTensorBoardsWriterBytes) {
  EXPECT_EQ(absl::BytesToHexString(FrameRecord("brain.Event:2")),
            "0d000000000000003c37b834627261696e2e4576656e743a32ee01067c");
}

// Any record: the length, the CRC of the length's bytes, the record, the CRC
// of the record, each read back as a reader would.
TEST(FrameRecordTest, FramesRandomRecordsAsTheFormatSays) {
  std::mt19937 rng(std::random_device{}());
  for (size_t size : {0, 1, 7, 255, 256, 70000}) {
    std::string record(size, '\0');
    for (char& c : record) c = static_cast<char>(rng());
    const std::string framed = FrameRecord(record);
    ASSERT_EQ(framed.size(), size + 16);
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(framed[i]);
    EXPECT_EQ(length, size);
    const auto u32_at = [&](size_t at) {
      uint32_t v = 0;
      for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(framed[at + i]);
      return v;
    };
    EXPECT_EQ(u32_at(8), MaskedCrc32c(framed.substr(0, 8)));
    EXPECT_EQ(framed.substr(12, size), record);
    EXPECT_EQ(u32_at(12 + size), MaskedCrc32c(record));
    EXPECT_NE(u32_at(12 + size), Crc32c(record));  // masked, not the plain CRC
  }
}

class RecordFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "record_file_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (fs::path(dir_) / "events").string();
  }
  // This binary has no LibTorch, whose remove_all crashes (io/file_tree.h).
  void TearDown() override { fs::remove_all(dir_); }

  std::string Contents() const {
    std::ifstream in(path_, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  std::string dir_, path_;
};

TEST_F(RecordFileTest, AppendsFramedRecordsVisibleAtOnceAndReopeningKeepsThem) {
  {
    absl::StatusOr<RecordFile> file = RecordFile::Open(path_);
    ASSERT_TRUE(file.ok()) << file.status();
    ASSERT_TRUE(file->Append("first").ok());
    // Unbuffered: a reader following the file sees the record now.
    EXPECT_EQ(Contents(), FrameRecord("first"));
  }
  absl::StatusOr<RecordFile> again = RecordFile::Open(path_);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE(again->Append("second").ok());
  EXPECT_EQ(Contents(), FrameRecord("first") + FrameRecord("second"));
}

TEST_F(RecordFileTest, AFolderThatCannotHoldTheFileIsNamed) {
  const std::string bad = (fs::path(dir_) / "missing" / "events").string();
  absl::StatusOr<RecordFile> file = RecordFile::Open(bad);
  ASSERT_FALSE(file.ok());
  EXPECT_TRUE(absl::IsNotFound(file.status())) << file.status();
  EXPECT_NE(file.status().message().find(bad), std::string::npos) << file.status();
}

}  // namespace
}  // namespace ballast::train
