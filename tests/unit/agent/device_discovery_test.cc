#include "worker/agent/device_discovery.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ballast::agent {
namespace {

TEST(DeviceDiscoveryTest, CpuSlotsReplaceGpuDiscovery) {
  absl::StatusOr<Devices> d = DiscoverDevices(3);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, "cpu");
  EXPECT_EQ(d->names, (std::vector<std::string>{"cpu-0", "cpu-1", "cpu-2"}));
}

TEST(DeviceDiscoveryTest, CpuSlotsOutOfRangeAreInvalid) {
  EXPECT_EQ(DiscoverDevices(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscoverDevices(4097).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DiscoverDevices(4096).ok());
}

TEST(DeviceDiscoveryTest, NoGpuAndNoCpuSlotsIsNotFoundAndNamesTheWayOut) {
  if (!NvmlDeviceNames().empty() || !NvidiaSmiDeviceNames().empty()) {
    GTEST_SKIP() << "this machine has a CUDA device";
  }
  absl::StatusOr<Devices> d = DiscoverDevices(0);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("--cpu-slots"));
}

TEST(DeviceDiscoveryTest, GpusAreFoundWhenPresent) {
  std::vector<std::string> nvml = NvmlDeviceNames();
  std::vector<std::string> smi = NvidiaSmiDeviceNames();
  if (nvml.empty() && smi.empty()) GTEST_SKIP() << "no CUDA device";
  absl::StatusOr<Devices> d = DiscoverDevices(0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->kind, "cuda");
  EXPECT_EQ(d->names, nvml.empty() ? smi : nvml);
  for (const std::string& name : d->names) EXPECT_FALSE(name.empty());
}

}  // namespace
}  // namespace ballast::agent
