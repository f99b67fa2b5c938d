#include "worker/train/trainer/tensorboard_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorboard/event.pb.h"
#include "worker/train/io/record_file.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class TensorBoardLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "tensorboard_log_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = (fs::path(tmpl) / "tensorboard").string();  // Open makes it
  }
  // This binary has no LibTorch, whose remove_all crashes (io/file_tree.h).
  void TearDown() override { fs::remove_all(fs::path(dir_).parent_path()); }

  // The file's events, each record's framing checked as a reader does.
  static std::vector<tensorboard::Event> Events(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes(std::istreambuf_iterator<char>(in), {});
    std::vector<tensorboard::Event> events;
    size_t at = 0;
    while (at < bytes.size()) {
      EXPECT_GE(bytes.size() - at, 16u);
      uint64_t length = 0;
      for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<uint8_t>(bytes[at + i]);
      const std::string record = bytes.substr(at + 12, length);
      EXPECT_EQ(FrameRecord(record), bytes.substr(at, length + 16));
      tensorboard::Event event;
      EXPECT_TRUE(event.ParseFromString(record));
      events.push_back(event);
      at += length + 16;
    }
    return events;
  }

  std::string dir_;
};

TEST(TensorBoardLogNameTest, IsTensorBoardsOwnWritersName) {
  EXPECT_EQ(TensorBoardLog::FileName(1765000000, "host-a", 4242),
            "events.out.tfevents.1765000000.host-a.4242");
  // Ten digits, so that names sort by time.
  EXPECT_EQ(TensorBoardLog::FileName(99, "h", 1), "events.out.tfevents.0000000099.h.1");
}

TEST_F(TensorBoardLogTest, StartsWithTheVersionAndASessionStartAfterTheResumeStep) {
  std::mt19937 rng(std::random_device{}());
  const int64_t step = std::uniform_int_distribution<int64_t>(0, 1000)(rng);
  const double before = static_cast<double>(time(nullptr)) - 1;
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir_, step);
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_EQ(fs::path(log->path()).parent_path(), fs::path(dir_));
  const std::string name = fs::path(log->path()).filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_TRUE(name.ends_with(absl::StrCat(".", getpid()))) << name;

  const std::vector<tensorboard::Event> events = Events(log->path());
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[1].step(), step + 1);
  for (const tensorboard::Event& e : events) {
    EXPECT_GE(e.wall_time(), before);
    EXPECT_LE(e.wall_time(), static_cast<double>(time(nullptr)) + 1);
  }
}

TEST_F(TensorBoardLogTest, WritesEachStepsScalarsAsFloat32LeavingOutMetricsLogsNulls) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> value(1e-6, 1e4);
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  std::vector<v1::StepMetrics> steps(4);
  for (int i = 0; i < 4; ++i) {
    v1::StepMetrics& m = steps[i];
    m.set_step(i + 1);
    m.set_loss(value(rng));
    m.set_grad_norm(value(rng));
    m.set_lr(value(rng));
    m.set_tokens_per_s(value(rng));
  }
  steps[1].clear_loss();  // no supervised token: metrics.jsonl's null
  steps[2].set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  steps[3].set_loss(std::numeric_limits<double>::infinity());
  for (const v1::StepMetrics& m : steps) ASSERT_TRUE(log->Step(m).ok());

  const std::vector<tensorboard::Event> events = Events(log->path());
  ASSERT_EQ(events.size(), 2u + steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const v1::StepMetrics& m = steps[i];
    const tensorboard::Event& e = events[2 + i];
    EXPECT_EQ(e.step(), m.step());
    std::vector<std::pair<std::string, double>> want;
    if (m.has_loss() && std::isfinite(m.loss())) want.emplace_back("train/loss", m.loss());
    if (std::isfinite(m.grad_norm())) want.emplace_back("train/grad_norm", m.grad_norm());
    want.emplace_back("train/lr", m.lr());
    want.emplace_back("train/tokens_per_s", m.tokens_per_s());
    ASSERT_EQ(e.summary().value_size(), static_cast<int>(want.size())) << e.DebugString();
    for (size_t k = 0; k < want.size(); ++k) {
      const tensorboard::Summary::Value& v = e.summary().value(static_cast<int>(k));
      EXPECT_EQ(v.tag(), want[k].first);
      ASSERT_EQ(v.value_case(), tensorboard::Summary::Value::kSimpleValue);
      // Exactly the float32 nearest the double: TensorBoard stores no more.
      EXPECT_EQ(v.simple_value(), static_cast<float>(want[k].second)) << v.tag();
    }
  }
}

TEST_F(TensorBoardLogTest, WritesTextForTheTextDashboardAndRestartsAfterARollback) {
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(dir_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  const std::string text = "guard rollback at step 7: non-finite grad_norm; rolled back to 2";
  ASSERT_TRUE(log->RestartAfter(2).ok());
  ASSERT_TRUE(log->Text("guard/rollback", 7, text).ok());

  const std::vector<tensorboard::Event> events = Events(log->path());
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(events[2].step(), 3);
  const tensorboard::Event& e = events[3];
  EXPECT_EQ(e.step(), 7);
  ASSERT_EQ(e.summary().value_size(), 1);
  const tensorboard::Summary::Value& v = e.summary().value(0);
  EXPECT_EQ(v.tag(), "guard/rollback");
  EXPECT_EQ(v.metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(v.metadata().data_class(), tensorboard::DATA_CLASS_TENSOR);
  EXPECT_EQ(v.tensor().dtype(), tensorboard::DT_STRING);
  EXPECT_EQ(v.tensor().tensor_shape().dim_size(), 0);
  ASSERT_EQ(v.tensor().string_val_size(), 1);
  EXPECT_EQ(v.tensor().string_val(0), text);
}

TEST_F(TensorBoardLogTest, AFolderThatCannotBeMadeIsNamed) {
  const std::string file = (fs::path(dir_).parent_path() / "a-file").string();
  std::ofstream(file) << "x";
  const std::string below = (fs::path(file) / "tensorboard").string();
  absl::StatusOr<TensorBoardLog> log = TensorBoardLog::Open(below, 0);
  ASSERT_FALSE(log.ok());
  EXPECT_NE(log.status().message().find(below), std::string::npos) << log.status();
}

}  // namespace
}  // namespace ballast::train
