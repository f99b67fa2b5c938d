// A test fixture that seeds LibTorch's generator afresh for every test, so
// that each run draws new inputs, and gives the seed back for the failure
// message: a failing draw can be replayed with torch::manual_seed(seed).
// Shared by the kernel tests that compare random inputs with a reference.
#ifndef BALLAST_TESTS_UNIT_KERNELS_SEEDED_TEST_H_
#define BALLAST_TESTS_UNIT_KERNELS_SEEDED_TEST_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <random>
#include <string>

namespace ballast::kernels {

// Derive a fixture from it (or name it in TEST_F) and open each test with
// SCOPED_TRACE(SeedTrace()). A fixture that skips in SetUp skips first and
// then calls SeededTest::SetUp().
class SeededTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    torch::manual_seed(seed_);
  }
  // "seed N", for SCOPED_TRACE.
  std::string SeedTrace() const { return "seed " + std::to_string(seed_); }

 private:
  uint64_t seed_ = 0;
};

}  // namespace ballast::kernels

#endif  // BALLAST_TESTS_UNIT_KERNELS_SEEDED_TEST_H_
