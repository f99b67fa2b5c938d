#include "kernels/lora_update.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace ballast::kernels {
namespace {

// Three modules side by side in y: columns [0, 5), [5, 8) without an
// adapter, and [8, 12); ranks 2 and 3 side by side in down.
constexpr double kScaling = 1.5;
const std::vector<int64_t> kOutBegins = {0, 8};

struct Inputs {
  at::Tensor x, w, down, b0, b1;  // y = x @ w^T is a fresh product, as in Decoder::project
};

Inputs RandomInputs() {
  auto leaf = [](std::vector<int64_t> sizes) {
    return torch::randn(sizes, torch::kDouble).requires_grad_(true);
  };
  return {leaf({7, 6}), leaf({12, 6}), leaf({7, 5}), leaf({5, 2}), leaf({4, 3})};
}

// The update from its definition, out of place.
at::Tensor Reference(const Inputs& in) {
  at::Tensor y = at::linear(in.x, in.w);
  at::Tensor add = torch::cat(
      {kScaling * in.down.narrow(1, 0, 2).mm(in.b0.t()), torch::zeros({7, 3}, torch::kDouble),
       kScaling * in.down.narrow(1, 2, 3).mm(in.b1.t())},
      1);
  return y + add;
}

// Expects got and want, and their gradients of sum(y * dy) for the leaves
// x, w, down, B0, B1, equal to float64 rounding; returns got's gradients.
std::vector<at::Tensor> ExpectEqualWithGradients(const at::Tensor& got, const at::Tensor& want,
                                                 const std::vector<at::Tensor>& leaves,
                                                 const at::Tensor& dy) {
  std::vector<at::Tensor> got_grads = torch::autograd::grad({got}, leaves, {dy});
  std::vector<at::Tensor> want_grads = torch::autograd::grad({want}, leaves, {dy});
  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12));
  const char* names[] = {"x", "w", "down", "B0", "B1"};
  for (size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got_grads[i], want_grads[i], 1e-12, 1e-12)) << names[i];
  }
  return got_grads;
}

TEST(LoraUpdate, MatchesTheDefinitionForwardAndBackward) {
  const Inputs in = RandomInputs();
  const at::Tensor dy = torch::randn({7, 12}, torch::kDouble);
  const std::vector<at::Tensor> leaves = {in.x, in.w, in.down, in.b0, in.b1};

  ExpectEqualWithGradients(
      add_lora_update(at::linear(in.x, in.w), in.down, {in.b0, in.b1}, kOutBegins, kScaling),
      Reference(in), leaves, dy);
}

TEST(LoraUpdate, FrozenOperandsGetNoGradient) {
  // LoRA's usual case: the base weight is frozen, the adapters train.
  Inputs in = RandomInputs();
  in.w = in.w.detach();
  at::Tensor y =
      add_lora_update(at::linear(in.x, in.w), in.down, {in.b0, in.b1}, kOutBegins, kScaling);
  y.sum().backward();
  EXPECT_FALSE(in.w.grad().defined());
  EXPECT_TRUE(in.b0.grad().defined() && in.b1.grad().defined() && in.down.grad().defined());
}

TEST(LoraUpdate, RefusesAnAdapterThatDoesNotFit) {
  const Inputs in = RandomInputs();
  try {
    add_lora_update(at::linear(in.x, in.w), in.down, {in.b0, in.b1}, {0, 9}, kScaling);
    FAIL() << "an adapter past y's columns was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit y"), std::string::npos) << e.what();
  }
}

TEST(LoraUpdate, RefusesAYThatIsNotAMatrix) {
  const Inputs in = RandomInputs();
  try {
    add_lora_update(at::linear(in.x, in.w).flatten(), in.down, {in.b0, in.b1}, kOutBegins,
                    kScaling);
    FAIL() << "a flat y was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("y must be (T, sum out)"), std::string::npos) << e.what();
  }
}

// Grouped: 9 rows in expert order over 4 experts (2, 0, 4, 3 rows: expert 1
// has none), y of two modules of 5 columns each, only the second adapted
// (rank 3) and the first too (rank 2), as the experts' gate/up is.
struct GroupedInputs {
  at::Tensor x, w, down, b0, b1, offsets;
};

GroupedInputs RandomGroupedInputs() {
  auto leaf = [](std::vector<int64_t> sizes) {
    return torch::randn(sizes, torch::kDouble).requires_grad_(true);
  };
  return {leaf({9, 6}),    leaf({10, 6}),   leaf({9, 5}),
          leaf({4, 5, 2}), leaf({4, 5, 3}), torch::tensor({2, 2, 6, 9}, torch::kInt)};
}

// Each expert's update from the definition, out of place.
at::Tensor GroupedReference(const GroupedInputs& in) {
  const int64_t starts[] = {0, 2, 2, 6, 9};
  std::vector<at::Tensor> blocks;
  for (int64_t e = 0; e < 4; ++e) {
    const at::Tensor down = in.down.narrow(0, starts[e], starts[e + 1] - starts[e]);
    blocks.push_back(torch::cat({kScaling * down.narrow(1, 0, 2).mm(in.b0[e].t()),
                                 kScaling * down.narrow(1, 2, 3).mm(in.b1[e].t())},
                                1));
  }
  return at::linear(in.x, in.w) + torch::cat(blocks, 0);
}

TEST(GroupedLoraUpdate, MatchesEachExpertsUpdateForwardAndBackward) {
  const GroupedInputs in = RandomGroupedInputs();
  const at::Tensor dy = torch::randn({9, 10}, torch::kDouble);
  const std::vector<at::Tensor> leaves = {in.x, in.w, in.down, in.b0, in.b1};

  const std::vector<at::Tensor> got_grads = ExpectEqualWithGradients(
      add_grouped_lora_update(at::linear(in.x, in.w), in.down, {in.b0, in.b1}, {0, 5}, in.offsets,
                              kScaling),
      GroupedReference(in), leaves, dy);
  // Expert 1 has no rows: its B gradients are zeros, not left unwritten.
  EXPECT_TRUE(torch::equal(got_grads[3][1], torch::zeros({5, 2}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(got_grads[4][1], torch::zeros({5, 3}, torch::kDouble)));
}

// Offsets that leave a row to no expert (its gradient would be unwritten) or
// adapters of another expert count are refused, naming what is wrong.
TEST(GroupedLoraUpdate, RefusesOffsetsAndAdaptersThatDoNotFit) {
  const GroupedInputs in = RandomGroupedInputs();
  const auto refused = [&](const at::Tensor& offsets, const at::Tensor& b1,
                           const std::string& what) {
    try {
      add_grouped_lora_update(at::linear(in.x, in.w), in.down, {in.b0, b1}, {0, 5}, offsets,
                              kScaling);
      ADD_FAILURE() << "accepted; expected: " << what;
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  refused(torch::tensor({2, 2, 6, 8}, torch::kInt), in.b1, "offsets must end at y's 9 rows");
  refused(torch::tensor({6, 2, 6, 9}, torch::kInt), in.b1,
          "offsets must be non-decreasing from 0, got [1] = 2 after 6");
  refused(in.offsets, in.b1.narrow(0, 0, 3), "adapter 1 has 3 experts, offsets 4");
}

}  // namespace
}  // namespace ballast::kernels
