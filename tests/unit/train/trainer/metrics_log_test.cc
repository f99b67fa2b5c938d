#include "worker/train/trainer/metrics_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker/train/io/file_tree.h"

namespace ballast::train {
namespace {

namespace fs = std::filesystem;

class MetricsLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "metrics_log_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = (fs::path(dir_) / "metrics.jsonl").string();
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  std::vector<std::string> Lines() const {
    std::vector<std::string> lines;
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  std::string dir_, path_;
};

v1::StepMetrics Applied(int64_t step) {
  v1::StepMetrics m;
  m.set_step(step);
  m.set_max_steps(10);
  m.set_loss(2.5);
  m.set_grad_norm(0.75);
  m.set_lr(1e-4);
  m.set_tokens(4096);
  m.set_supervised_tokens(3000);
  m.set_tokens_per_s(8192.5);
  m.set_step_time_s(0.5);
  // Past 2^32: proto3's JSON mapping would print it as a string.
  m.set_peak_memory_bytes(int64_t{5} << 40);
  m.set_communicated_bytes(123456789012);
  m.set_replica_communicated_bytes(int64_t{1} << 33);
  m.set_collective_wait_s(0.125);
  return m;
}

TEST_F(MetricsLogTest, ALineHasEveryFieldWithIntegersAsNumbers) {
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE(log->Append(Applied(1), "").ok());
  const std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 1u);
  const nlohmann::json line = nlohmann::json::parse(lines[0]);
  for (const char* name : {"step", "max_steps", "tokens", "supervised_tokens", "peak_memory_bytes",
                           "communicated_bytes", "replica_communicated_bytes"}) {
    ASSERT_TRUE(line.contains(name)) << name;
    EXPECT_TRUE(line[name].is_number_integer()) << name << " is " << line[name];
  }
  EXPECT_EQ(line["step"].get<int64_t>(), 1);
  EXPECT_EQ(line["peak_memory_bytes"].get<int64_t>(), int64_t{5} << 40);
  EXPECT_EQ(line["communicated_bytes"].get<int64_t>(), 123456789012);
  EXPECT_EQ(line["replica_communicated_bytes"].get<int64_t>(), int64_t{1} << 33);
  EXPECT_EQ(line["collective_wait_s"].get<double>(), 0.125);
  EXPECT_EQ(line["tokens"].get<int64_t>(), 4096);
  EXPECT_EQ(line["supervised_tokens"].get<int64_t>(), 3000);
  // Doubles print as nlohmann prints them (the shortest form that reads back
  // equal), so they compare exactly.
  EXPECT_EQ(line["loss"].get<double>(), 2.5);
  EXPECT_EQ(line["grad_norm"].get<double>(), 0.75);
  EXPECT_EQ(line["lr"].get<double>(), 1e-4);
  EXPECT_EQ(line["tokens_per_s"].get<double>(), 8192.5);
  EXPECT_EQ(line["step_time_s"].get<double>(), 0.5);
  EXPECT_EQ(line["skipped"], false);
  EXPECT_FALSE(line.contains("skip_reason"));
}

TEST_F(MetricsLogTest, AMissingLossAndANonFiniteGradNormAreNullAndASkipSaysWhy) {
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  v1::StepMetrics m = Applied(1);
  m.clear_loss();
  m.set_grad_norm(std::numeric_limits<double>::quiet_NaN());
  m.set_skipped(true);
  m.set_supervised_tokens(0);
  ASSERT_TRUE(log->Append(m, "no supervised tokens").ok());
  const nlohmann::json line = nlohmann::json::parse(Lines().at(0));
  ASSERT_TRUE(line.contains("loss"));
  EXPECT_TRUE(line["loss"].is_null());
  ASSERT_TRUE(line.contains("grad_norm"));
  EXPECT_TRUE(line["grad_norm"].is_null());
  EXPECT_EQ(line["supervised_tokens"], 0);
  EXPECT_EQ(line["skipped"], true);
  EXPECT_EQ(line["skip_reason"], "no supervised tokens");
}

// A dense model's line has a null aux_loss and no moe object; an MoE
// model's has both, its per-layer doubles in the file's forms (a non-finite
// one null).
TEST_F(MetricsLogTest, AnMoeStepCarriesItsRoutingAndADenseStepNone) {
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path_, 0);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE(log->Append(Applied(1), "").ok());
  v1::StepMetrics moe = Applied(2);
  moe.set_aux_loss(1.25);
  moe.mutable_moe()->set_expert_load_max_ratio(3.5);
  v1::MoeLayerMetrics* layer = moe.mutable_moe()->add_layers();
  layer->set_layer(3);
  layer->set_expert_load_max_ratio(3.5);
  layer->set_idle_expert_fraction(0.25);
  layer->set_router_entropy(std::numeric_limits<double>::infinity());
  layer->set_top_k_share(0.5);
  ASSERT_TRUE(log->Append(moe, "").ok());
  const nlohmann::json dense = nlohmann::json::parse(Lines().at(0));
  EXPECT_TRUE(dense["aux_loss"].is_null());
  EXPECT_FALSE(dense.contains("moe"));
  const nlohmann::json line = nlohmann::json::parse(Lines().at(1));
  EXPECT_EQ(line["aux_loss"].get<double>(), 1.25);
  EXPECT_EQ(line["moe"]["expert_load_max_ratio"].get<double>(), 3.5);
  ASSERT_EQ(line["moe"]["layers"].size(), 1u);
  const nlohmann::json& l = line["moe"]["layers"][0];
  EXPECT_EQ(l["layer"], 3);
  EXPECT_EQ(l["idle_expert_fraction"].get<double>(), 0.25);
  EXPECT_EQ(l["top_k_share"].get<double>(), 0.5);
  EXPECT_TRUE(l["router_entropy"].is_null());
}

TEST_F(MetricsLogTest, OpeningAtAStepDropsTheLinesOfLaterSteps) {
  {
    absl::StatusOr<MetricsLog> log = MetricsLog::Open(path_, 0);
    ASSERT_TRUE(log.ok()) << log.status();
    for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(log->Append(Applied(step), "").ok());
  }
  absl::StatusOr<MetricsLog> log = MetricsLog::Open(path_, 2);
  ASSERT_TRUE(log.ok()) << log.status();
  ASSERT_TRUE(log->Append(Applied(3), "").ok());
  std::vector<int64_t> steps;
  for (const std::string& line : Lines()) {
    steps.push_back(nlohmann::json::parse(line)["step"].get<int64_t>());
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
}

}  // namespace
}  // namespace ballast::train
