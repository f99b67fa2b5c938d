#include "worker/train/io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/train/io/file_tree.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "safetensors_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_.string()).ok()); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a file from raw parts so tests can build any corruption.
  std::string WriteRaw(const std::string& name, uint64_t header_size, const std::string& header,
                       const std::string& data) const {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(&header_size), sizeof(header_size));
    out << header << data;
    return path;
  }
  std::string WriteRaw(const std::string& name, const std::string& header,
                       const std::string& data) const {
    return WriteRaw(name, header.size(), header, data);
  }

  fs::path dir_;
};

absl::Status OpenStatus(const std::string& path) { return SafetensorsFile::Open(path).status(); }

// Whether python3 has safetensors and torch. Looks them up without importing
// torch, which takes seconds.
bool HavePythonSafetensors() {
  return std::system(
             "python3 -c 'import importlib.util as u, sys; "
             "sys.exit(not (u.find_spec(\"safetensors\") and u.find_spec(\"torch\")))' "
             ">/dev/null 2>&1") == 0;
}

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  torch::manual_seed(0);
  std::map<std::string, at::Tensor> tensors = {
      {"f64", torch::randn({3, 2}, torch::kDouble)},
      {"f32", torch::randn({5}, torch::kFloat)},
      {"f16", torch::randn({2, 3}).to(torch::kHalf)},
      {"bf16", torch::randn({7}).to(torch::kBFloat16)},
      {"i64", torch::arange(-3, 3, torch::kLong)},
      {"i32", torch::arange(-4, 4, torch::kInt).reshape({2, 4})},
      {"i16", torch::arange(-2, 3, torch::kShort)},
      {"i8", torch::arange(-128, 128, 37, torch::kChar)},
      {"u8", torch::arange(0, 256, 51, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::tensor(3.5f)},
      {"empty", torch::empty({0, 4})},
      {"strided", torch::arange(12, torch::kFloat).reshape({3, 4}).t()},
  };
  const std::string path = Path("all.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"format", "pt"}}).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ((*file)->names().size(), tensors.size());
  for (const auto& [name, want] : tensors) {
    auto got = (*file)->tensor(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->scalar_type(), want.scalar_type()) << name;
    EXPECT_EQ(got->sizes(), want.sizes()) << name;
    // Bytes are copied verbatim, so equality is exact.
    EXPECT_TRUE(torch::equal(*got, want)) << name;
  }
}

TEST_F(SafetensorsTest, AFifoIsRefusedWithoutWaitingForAWriter) {
  ASSERT_EQ(mkfifo(Path("model.safetensors").c_str(), 0600), 0);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(Path("model.safetensors"));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("is a FIFO; a regular file is needed"));
}

TEST_F(SafetensorsTest, AlignsDataBufferToEightBytes) {
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", torch::ones({3})}}).ok());
  std::ifstream in(path, std::ios::binary);
  uint64_t header_size = 0;
  in.read(reinterpret_cast<char*>(&header_size), sizeof(header_size));
  EXPECT_EQ((8 + header_size) % 8, 0u);
  EXPECT_EQ(fs::file_size(path), 8 + header_size + 3 * sizeof(float));
}

TEST_F(SafetensorsTest, WriteLeavesNoTemporaryFile) {
  ASSERT_TRUE(WriteSafetensors(Path("a.safetensors"), {{"x", torch::ones({3})}}).ok());
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    files.push_back(entry.path().filename().string());
  }
  EXPECT_THAT(files, ElementsAre("a.safetensors"));
}

TEST_F(SafetensorsTest, TensorOutlivesFile) {
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", torch::arange(4, torch::kFloat)}}).ok());
  at::Tensor t;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    t = *(*file)->tensor("x");
  }
  fs::remove(path);
  EXPECT_TRUE(torch::equal(t, torch::arange(4, torch::kFloat)));
}

TEST_F(SafetensorsTest, CopiesTensorsThatAreUnalignedInTheFile) {
  // Padding the header so the data starts at an odd file offset misaligns the f32s.
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  while ((8 + header.size()) % 4 != 1) header += ' ';
  const float values[2] = {1.5f, -2.25f};
  const std::string path = WriteRaw(
      "u.safetensors", header, std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->tensor("x");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data_ptr()) % alignof(float), 0u);
  EXPECT_TRUE(torch::equal(*t, torch::tensor({1.5f, -2.25f})));
}

TEST_F(SafetensorsTest, UnknownTensorIsNotFound) {
  const std::string path = Path("a.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", torch::ones({1})}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_FALSE((*file)->contains("y"));
  EXPECT_EQ((*file)->tensor("y").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, ListsNamesInOffsetOrder) {
  const std::string path = WriteRaw("o.safetensors",
                                    R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                    R"("a":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                                    "xyz");
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(), ElementsAre("b", "a"));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const absl::Status s = OpenStatus(Path("nope.safetensors"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("nope.safetensors"));
}

TEST_F(SafetensorsTest, RejectsFileShorterThanHeaderSize) {
  const std::string path = Path("short.safetensors");
  std::ofstream(path) << "abc";
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST_F(SafetensorsTest, RejectsHeaderThatIsNotJson) {
  const std::string path = WriteRaw("bad.safetensors", "{\"x\": [1, 2", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("JSON"));
}

TEST_F(SafetensorsTest, RejectsHeaderSizeLargerThanFile) {
  const std::string path = WriteRaw("big.safetensors", 1000, "{}", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("1000"));
}

TEST_F(SafetensorsTest, RejectsHeaderSizeOverLimit) {
  const std::string path = WriteRaw("huge.safetensors", 100'000'001, "{}", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("limit"));
}

TEST_F(SafetensorsTest, RejectsOverlappingOffsets) {
  const std::string path = WriteRaw("overlap.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                    std::string(12, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  EXPECT_THAT(s.message(), HasSubstr("overlap"));
}

TEST_F(SafetensorsTest, RejectsHoleBetweenTensors) {
  const std::string path = WriteRaw("hole.safetensors",
                                    R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                    std::string(12, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
  EXPECT_THAT(s.message(), HasSubstr("hole"));
}

TEST_F(SafetensorsTest, RejectsTrailingBytesAfterLastTensor) {
  const std::string path =
      WriteRaw("tail.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
               std::string(8, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("cover 4 bytes of the 8-byte"));
}

TEST_F(SafetensorsTest, RejectsTruncatedData) {
  const std::string path =
      WriteRaw("trunc.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
               std::string(10, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
}

TEST_F(SafetensorsTest, RejectsByteLengthThatDisagreesWithShape) {
  const std::string path =
      WriteRaw("size.safetensors", R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})",
               std::string(8, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  EXPECT_THAT(s.message(), HasSubstr("needs 6"));
}

TEST_F(SafetensorsTest, RejectsShapeWhoseSizeOverflows) {
  const std::string path =
      WriteRaw("ovf.safetensors",
               R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("overflows"));
}

TEST_F(SafetensorsTest, RejectsNegativeShape) {
  const std::string path =
      WriteRaw("neg.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  EXPECT_THAT(s.message(), HasSubstr("non-negative"));
}

TEST_F(SafetensorsTest, RejectsUnknownDtype) {
  const std::string path =
      WriteRaw("f8.safetensors", R"({"w":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})",
               std::string(2, '\0'));
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  EXPECT_THAT(s.message(), HasSubstr("F8_E4M3"));
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  const std::string path = WriteRaw("dup.safetensors",
                                    R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                    R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                    "ab");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'w'"));
  EXPECT_THAT(s.message(), HasSubstr("more than once"));
}

TEST_F(SafetensorsTest, RejectsNonStringMetadata) {
  const std::string path = WriteRaw("meta.safetensors", R"({"__metadata__":{"step":3}})", "");
  const absl::Status s = OpenStatus(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(path));
  EXPECT_THAT(s.message(), HasSubstr("step"));
}

TEST_F(SafetensorsTest, WriteRejectsUnsupportedDtype) {
  const std::string path = Path("c.safetensors");
  const absl::Status s = WriteSafetensors(path, {{"z", torch::zeros({2}, torch::kComplexFloat)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'z'"));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriteIntoMissingFolderIsNotFound) {
  const absl::Status s = WriteSafetensors(Path("missing/a.safetensors"), {{"x", torch::ones({1})}});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("missing/a.safetensors"));
}

TEST_F(SafetensorsTest, ReadsFileWrittenByPython) {
  if (!HavePythonSafetensors()) GTEST_SKIP() << "python3 with safetensors is not available";
  const std::string path = Path("py.safetensors");
  const std::string cmd =
      "python3 -c 'import sys, torch\n"
      "from safetensors.torch import save_file\n"
      "save_file({\"bf16\": torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16),\n"
      "           \"f16\": torch.tensor([[0.5, -0.25]], dtype=torch.float16),\n"
      "           \"i64\": torch.tensor([-(2**40), 7]),\n"
      "           \"bool\": torch.tensor([True, False, True])},\n"
      "          sys.argv[1], metadata={\"format\": \"pt\"})' " +
      path;
  ASSERT_EQ(std::system(cmd.c_str()), 0);

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  EXPECT_TRUE(torch::equal(*(*file)->tensor("bf16"),
                           torch::tensor({1.5, -2.0, 3.25}).to(torch::kBFloat16)));
  EXPECT_TRUE(
      torch::equal(*(*file)->tensor("f16"), torch::tensor({{0.5, -0.25}}).to(torch::kHalf)));
  EXPECT_TRUE(torch::equal(*(*file)->tensor("i64"),
                           torch::tensor({-(int64_t{1} << 40), int64_t{7}}, torch::kLong)));
  EXPECT_TRUE(torch::equal(*(*file)->tensor("bool"), torch::tensor({true, false, true})));
}

TEST_F(SafetensorsTest, PythonReadsFileWeWrite) {
  if (!HavePythonSafetensors()) GTEST_SKIP() << "python3 with safetensors is not available";
  const std::string path = Path("cc.safetensors");
  ASSERT_TRUE(WriteSafetensors(path,
                               {{"bf16", torch::tensor({1.5, -2.0}).to(torch::kBFloat16)},
                                {"i32", torch::tensor({-7, 9}, torch::kInt)},
                                {"bool", torch::tensor({false, true})},
                                {"i8", torch::ones({3}, torch::kChar)},
                                {"scalar", torch::tensor(2.5f)},
                                {"empty", torch::empty({0, 3})}},
                               {{"step", "12"}})
                  .ok());
  const std::string cmd =
      "python3 -c 'import sys, torch\n"
      "from safetensors import safe_open\n"
      "with safe_open(sys.argv[1], \"pt\") as f:\n"
      "    assert f.metadata() == {\"step\": \"12\"}, f.metadata()\n"
      "    assert torch.equal(f.get_tensor(\"bf16\"), "
      "torch.tensor([1.5, -2.0], dtype=torch.bfloat16))\n"
      "    assert torch.equal(f.get_tensor(\"i32\"), torch.tensor([-7, 9], dtype=torch.int32))\n"
      "    assert torch.equal(f.get_tensor(\"bool\"), torch.tensor([False, True]))\n"
      "    assert torch.equal(f.get_tensor(\"i8\"), torch.ones(3, dtype=torch.int8))\n"
      "    assert torch.equal(f.get_tensor(\"scalar\"), torch.tensor(2.5))\n"
      "    assert f.get_tensor(\"empty\").shape == (0, 3)' " +
      path;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

// ---------------------------------------------------------------------------
// SafetensorsCheckpoint

class SafetensorsCheckpointTest : public SafetensorsTest {
 protected:
  void WriteIndex(const std::string& text) const {
    std::ofstream(Path("model.safetensors.index.json")) << text;
  }
};

TEST_F(SafetensorsCheckpointTest, OpensSingleFile) {
  ASSERT_TRUE(WriteSafetensors(Path("model.safetensors"),
                               {{"a", torch::ones({2})}, {"b", torch::zeros({3})}})
                  .ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->names(), ElementsAre("a", "b"));
  EXPECT_TRUE(torch::equal(*ckpt->tensor("b"), torch::zeros({3})));
  EXPECT_EQ(ckpt->tensor("c").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsCheckpointTest, OpensAdapterFileByName) {
  ASSERT_TRUE(
      WriteSafetensors(Path("adapter_model.safetensors"), {{"lora_A", torch::ones({2})}}).ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string(), "adapter_model.safetensors");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(ckpt->contains("lora_A"));
}

TEST_F(SafetensorsCheckpointTest, OpensShardsThroughIndex) {
  ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                               {{"a", torch::ones({2})}, {"b", torch::full({2}, 2.0)}})
                  .ok());
  ASSERT_TRUE(
      WriteSafetensors(Path("model-00002-of-00002.safetensors"), {{"c", torch::full({1}, 3.0)}})
          .ok());
  WriteIndex(R"({"metadata": {"total_size": 20}, "weight_map": {
      "a": "model-00001-of-00002.safetensors",
      "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->names(), ElementsAre("a", "b", "c"));
  EXPECT_TRUE(torch::equal(*ckpt->tensor("b"), torch::full({2}, 2.0)));
  EXPECT_TRUE(torch::equal(*ckpt->tensor("c"), torch::full({1}, 3.0)));
}

TEST_F(SafetensorsCheckpointTest, IndexNamingMissingShardIsNotFound) {
  ASSERT_TRUE(
      WriteSafetensors(Path("model-00001-of-00002.safetensors"), {{"a", torch::ones({2})}}).ok());
  WriteIndex(R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                 "b": "model-00002-of-00002.safetensors"}})");
  const absl::Status s = SafetensorsCheckpoint::Open(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(s.message(), HasSubstr("'b'"));
}

TEST_F(SafetensorsCheckpointTest, IndexNamingTensorAbsentFromShardIsDataLoss) {
  ASSERT_TRUE(WriteSafetensors(Path("shard.safetensors"), {{"a", torch::ones({2})}}).ok());
  WriteIndex(R"({"weight_map": {"a": "shard.safetensors", "ghost": "shard.safetensors"}})");
  const absl::Status s = SafetensorsCheckpoint::Open(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("'ghost'"));
  EXPECT_THAT(s.message(), HasSubstr("shard.safetensors"));
}

TEST_F(SafetensorsCheckpointTest, RejectsShardPathOutsideFolder) {
  WriteIndex(R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  const absl::Status s = SafetensorsCheckpoint::Open(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("../elsewhere.safetensors"));
}

TEST_F(SafetensorsCheckpointTest, CorruptShardNamesShard) {
  WriteRaw("shard.safetensors", "{not json", "");
  WriteIndex(R"({"weight_map": {"a": "shard.safetensors"}})");
  const absl::Status s = SafetensorsCheckpoint::Open(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(Path("shard.safetensors")));
}

TEST_F(SafetensorsCheckpointTest, MissingCheckpointNamesBothPaths) {
  const absl::Status s = SafetensorsCheckpoint::Open(dir_.string()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr(Path("model.safetensors")));
  EXPECT_THAT(s.message(), HasSubstr(Path("model.safetensors.index.json")));
}

TEST_F(SafetensorsCheckpointTest, EmptyWeightMapOpensEmpty) {
  WriteIndex(R"({"weight_map": {}})");
  auto ckpt = SafetensorsCheckpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_THAT(ckpt->names(), IsEmpty());
}

}  // namespace
}  // namespace ballast::train
