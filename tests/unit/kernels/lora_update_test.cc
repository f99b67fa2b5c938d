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

TEST(LoraUpdate, MatchesTheDefinitionForwardAndBackward) {
  const Inputs in = RandomInputs();
  const at::Tensor dy = torch::randn({7, 12}, torch::kDouble);
  const std::vector<at::Tensor> leaves = {in.x, in.w, in.down, in.b0, in.b1};

  at::Tensor got =
      add_lora_update(at::linear(in.x, in.w), in.down, {in.b0, in.b1}, kOutBegins, kScaling);
  std::vector<at::Tensor> got_grads = torch::autograd::grad({got}, leaves, {dy});
  at::Tensor want = Reference(in);
  std::vector<at::Tensor> want_grads = torch::autograd::grad({want}, leaves, {dy});

  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12));
  const char* names[] = {"x", "w", "down", "B0", "B1"};
  for (size_t i = 0; i < leaves.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got_grads[i], want_grads[i], 1e-12, 1e-12)) << names[i];
  }
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

}  // namespace
}  // namespace ballast::kernels
