#include "worker/train/rank/device_info.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ballast::train {
namespace {

using ::testing::HasSubstr;

VisibleDevices Gpus(int count, std::optional<std::string> visible = std::nullopt) {
  VisibleDevices found;
  found.cuda_built = true;
  found.cuda_devices = count;
  found.cuda_visible_devices = std::move(visible);
  return found;
}

TEST(ChooseDevice, AutoTakesTheRanksGpuWhenOneIsVisibleAndTheCpuOtherwise) {
  EXPECT_EQ(*ChooseDevice("auto", Gpus(1, "3")), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(*ChooseDevice("auto", Gpus(8)), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(*ChooseDevice("auto", Gpus(0, "")), c10::Device(c10::kCPU));
  VisibleDevices cpu_build = Gpus(2);
  cpu_build.cuda_built = false;
  EXPECT_EQ(*ChooseDevice("auto", cpu_build), c10::Device(c10::kCPU));
}

TEST(ChooseDevice, CpuIsTheCpuEvenBesideAGpu) {
  EXPECT_EQ(*ChooseDevice("cpu", Gpus(1, "0")), c10::Device(c10::kCPU));
}

TEST(ChooseDevice, CudaWithoutAUsableGpuIsRefusedSayingWhatWasFound) {
  EXPECT_EQ(*ChooseDevice("cuda", Gpus(1, "5")), c10::Device(c10::kCUDA, 0));

  absl::StatusOr<c10::Device> empty = ChooseDevice("cuda", Gpus(0, ""));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.status().message(), HasSubstr("device: cuda, but this rank has no usable GPU"));
  EXPECT_THAT(empty.status().message(), HasSubstr("CUDA_VISIBLE_DEVICES is empty"));

  absl::StatusOr<c10::Device> none = ChooseDevice("cuda", Gpus(0));
  EXPECT_THAT(none.status().message(),
              HasSubstr("the CUDA driver reports no device (CUDA_VISIBLE_DEVICES is unset"));
  absl::StatusOr<c10::Device> hidden = ChooseDevice("cuda", Gpus(0, "7"));
  EXPECT_THAT(hidden.status().message(), HasSubstr("among CUDA_VISIBLE_DEVICES=7"));

  VisibleDevices cpu_build = Gpus(2);
  cpu_build.cuda_built = false;
  EXPECT_THAT(ChooseDevice("cuda", cpu_build).status().message(), HasSubstr("built without CUDA"));
  EXPECT_EQ(ChooseDevice("tpu", Gpus(1)).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChooseDevice, ThisMachineAgreesWithItsProbe) {
  // The probe of the machine the test runs on: without a GPU, cuda is
  // refused and auto is the CPU; with one, both are cuda:0.
  const VisibleDevices found = ProbeDevices();
  const bool gpu = found.cuda_built && found.cuda_devices > 0;
  EXPECT_EQ(ChooseDevice("cuda", found).ok(), gpu);
  EXPECT_EQ(ChooseDevice("auto", found)->is_cuda(), gpu);
}

}  // namespace
}  // namespace ballast::train
