#include "worker/train/model/finite_weights.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"

namespace ballast::train {
namespace {

using ::testing::HasSubstr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The first non-finite element of `t` flattened, in float64, or -1.
int64_t Reference(const at::Tensor& t) {
  const at::Tensor bad = at::logical_not(at::isfinite(t.to(torch::kDouble).reshape({-1})));
  const at::Tensor at = bad.nonzero();
  return at.size(0) == 0 ? -1 : at[0][0].item<int64_t>();
}

// Random tensors, fp32 and bf16, one kept as pieces, with NaN and the
// infinities planted at fresh random elements of some.
struct Planted {
  ParamStore store;
  std::vector<at::Tensor> whole;  // each tensor's elements, as one tensor
};

Planted PlantedStore(std::mt19937_64& rng) {
  Planted p;
  const auto add = [&](const std::string& name, at::Tensor t, float bad) {
    if (bad != 0) {
      // Not the last element: the second one below must come after it, not
      // overwrite it (which made the first one found a NaN once in 1024 runs).
      const int64_t at = std::uniform_int_distribution<int64_t>(0, t.numel() - 2)(rng);
      t.reshape({-1})[at] = bad;
      // A second one after it: the first is the one to find.
      t.reshape({-1})[std::min(at + 3, t.numel() - 1)] = kNaN;
    }
    p.store.Add(name, t, ParamStore::kNoLayer, false);
    p.whole.push_back(t);
  };
  add("model.embed_tokens.weight", torch::randn({64, 16}), kInf);
  add("model.layers.0.self_attn.q_proj.weight", torch::randn({16, 16}), 0);
  add("model.layers.0.mlp.up_proj.weight", torch::randn({24, 16}).to(torch::kBFloat16), -kInf);
  add("model.layers.0.input_layernorm.weight", torch::randn({16}), kNaN);
  // Experts as pieces, the bad element in the second expert.
  std::vector<at::Tensor> experts = {torch::randn({6, 16}), torch::randn({6, 16}),
                                     torch::randn({6, 16})};
  const int64_t at = std::uniform_int_distribution<int64_t>(0, 6 * 16 - 1)(rng);
  experts[1].reshape({-1})[at] = kNaN;
  p.store.AddPieces("model.layers.1.mlp.experts.down_proj", {3, 6, 16}, experts, 1, false);
  p.whole.push_back(torch::stack(experts));
  add("model.norm.weight", torch::randn({16}), 0);
  return p;
}

TEST(FiniteWeights, FindsEachTensorsFirstNonFiniteElementAsTheReferenceDoes) {
  std::mt19937_64 rng(std::random_device{}());
  const Planted p = PlantedStore(rng);
  const at::Tensor whole = FirstNonFiniteElements(p.store, 0, 1);
  ASSERT_EQ(whole.size(0), static_cast<int64_t>(p.whole.size()));
  for (size_t i = 0; i < p.whole.size(); ++i) {
    EXPECT_EQ(whole[i].item<int64_t>(), Reference(p.whole[i]) + 1) << p.store.names()[i];
  }
  // Three ranks check a third each, and their sum is the whole check.
  at::Tensor sum = torch::zeros_like(whole);
  for (int rank = 0; rank < 3; ++rank) {
    const at::Tensor share = FirstNonFiniteElements(p.store, rank, 3);
    for (int64_t i = 0; i < share.size(0); ++i) {
      if (i % 3 != rank) EXPECT_EQ(share[i].item<int64_t>(), 0);
    }
    sum += share;
  }
  EXPECT_TRUE(torch::equal(sum, whole));
}

TEST(FiniteWeights, RefusesTheFirstBadTensorNamingTheElement) {
  std::mt19937_64 rng(std::random_device{}());
  const Planted p = PlantedStore(rng);
  const at::Tensor first = FirstNonFiniteElements(p.store, 0, 1);
  const absl::Status s = RefuseNonFiniteWeights(p.store, first, "/models/m");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const int64_t at = Reference(p.whole[0]);
  EXPECT_THAT(s.message(),
              HasSubstr(absl::StrCat("model.path /models/m: tensor model.embed_tokens.weight holds "
                                     "inf at flat index ",
                                     at, " (element [", at / 16, ", ", at % 16, "])")));
  EXPECT_THAT(s.message(), HasSubstr("; 3 more tensors hold one too"));

  ParamStore finite;
  finite.Add("model.norm.weight", torch::randn({16}), ParamStore::kNoLayer, false);
  EXPECT_TRUE(RefuseNonFiniteWeights(finite, FirstNonFiniteElements(finite, 0, 1), "m").ok());
}

TEST(FiniteWeights, TheCheckCostsAboutACopyOfTheWeights) {
  // One pass that writes nothing, against a copy of the weights (what the
  // loader makes anyway), measured side by side, the best of 3 of each; the
  // figures are those of docs/reliability.md (about 1x a copy there, and
  // isfinite().all() about 30x a min and max). 128 MiB in fp32 and 64 MiB
  // in bf16 (a sharded rank checks the file's dtype). The bound is 2x: a
  // shared, loaded machine.
  for (const at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    ParamStore store;
    for (int i = 0; i < 8; ++i) {
      store.Add(absl::StrCat("w", i), torch::randn({4096, 1024}).to(dtype), ParamStore::kNoLayer,
                false);
    }
    const double bytes = 8.0 * 4096 * 1024 * c10::elementSize(dtype);
    double check = 1e9, copy = 1e9;
    for (int round = 0; round < 3; ++round) {
      auto start = std::chrono::steady_clock::now();
      const at::Tensor found = FirstNonFiniteElements(store, 0, 1);
      check = std::min(
          check, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      EXPECT_EQ(found.sum().item<int64_t>(), 0);
      start = std::chrono::steady_clock::now();
      for (const std::string& name : store.names()) store.get(name).clone();
      copy = std::min(
          copy, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("finite check of %.0f MiB %s: %.1f ms (%.2f GB/s); a copy: %.1f ms (%.2f GB/s)\n",
                bytes / (1 << 20), c10::toString(dtype), check * 1e3, bytes / check / 1e9,
                copy * 1e3, bytes / copy / 1e9);
    EXPECT_LT(check, 2 * copy) << c10::toString(dtype);
  }
}

}  // namespace
}  // namespace ballast::train
