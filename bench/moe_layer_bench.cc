// The Mixture-of-Experts layer on CPU, forward and backward, composed from
// the kernels as a model's layer composes them (bench/moe_layer.py runs it
// beside transformers' Qwen3MoeSparseMoeBlock and prints the rows):
//
//   router   logits = x . gate^T, softmax in fp32, top-k, renormalised
//   experts  SortByExpert; x gathered by token (gather_expert_rows);
//            grouped_linear to gate_up (E, 2I, H); swiglu; grouped_linear to
//            down (E, H, I)
//   combine  each token's rows weighted by their routing weights and summed
//            (combine_expert_rows)
//
// and, at the same shapes, the six grouped products of the experts alone
// (forward and both gradients of both projections) against six dense at::mm
// of exactly the same FLOPs: every routed row through one weight, which is
// the machine's dense-GEMM rate for this work.
//
// Usage: moe_layer_bench TOKENS HIDDEN INTERMEDIATE EXPERTS TOP_K REPS
// Prints one JSON line: the median seconds of each over REPS timed rounds.
#include <ATen/ATen.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "kernels/expert_order.h"
#include "kernels/expert_rows.h"
#include "kernels/grouped_linear.h"
#include "kernels/swiglu.h"

namespace ballast::bench {
namespace {

struct Shape {
  int64_t tokens, hidden, intermediate, experts, top_k;
};

// Median seconds of each step over `reps` rounds, after one untimed warm-up
// of each (thread pools, allocator, BLAS buffers). The steps take turns within
// a round, so that a shared machine's load weighs on each alike.
std::vector<double> MedianSeconds(const std::vector<std::function<void()>>& steps, int reps) {
  for (const auto& step : steps) step();
  std::vector<std::vector<double>> seconds(steps.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto start = std::chrono::steady_clock::now();
      steps[i]();
      seconds[i].push_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& s : seconds) {
    std::sort(s.begin(), s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

// The whole layer, loss sum(out * d_out), gradients for x and every weight.
std::function<void()> LayerStep(const Shape& s) {
  const at::Tensor x = torch::randn({s.tokens, s.hidden}).requires_grad_(true);
  const at::Tensor gate = (torch::randn({s.experts, s.hidden}) * 0.02).requires_grad_(true);
  const at::Tensor gate_up =
      (torch::randn({s.experts, 2 * s.intermediate, s.hidden}) * 0.02).requires_grad_(true);
  const at::Tensor down =
      (torch::randn({s.experts, s.hidden, s.intermediate}) * 0.02).requires_grad_(true);
  const at::Tensor d_out = torch::randn({s.tokens, s.hidden});
  return [=] {
    const at::Tensor probs = at::softmax(at::mm(x, gate.t()).to(at::kFloat), 1);
    auto [weights, selected] = probs.topk(s.top_k, 1);
    weights = weights / weights.sum(1, /*keepdim=*/true);
    const kernels::ExpertOrder order = kernels::SortByExpert(selected, s.experts);
    const at::Tensor act = kernels::swiglu(
        kernels::grouped_linear(kernels::gather_expert_rows(x, order), gate_up, order.offsets));
    const at::Tensor rows = kernels::grouped_linear(act, down, order.offsets);
    const at::Tensor out = kernels::combine_expert_rows(rows, weights, order);
    (out * d_out).sum().backward();
    for (const at::Tensor& t : {x, gate, gate_up, down}) t.mutable_grad().reset();
  };
}

// The experts' six products, grouped (ours) or dense (one weight for all rows).
std::function<void()> ProductsStep(const Shape& s, bool grouped) {
  const int64_t rows = s.tokens * s.top_k;
  const at::Tensor selected = std::get<1>(torch::rand({s.tokens, s.experts}).topk(s.top_k, 1));
  const at::Tensor offsets = kernels::SortByExpert(selected, s.experts).offsets;
  const at::Tensor x = torch::randn({rows, s.hidden});
  const at::Tensor act = torch::randn({rows, s.intermediate});
  const at::Tensor d_gu = torch::randn({rows, 2 * s.intermediate});
  const at::Tensor d_y = torch::randn({rows, s.hidden});
  if (grouped) {
    const at::Tensor gate_up =
        torch::randn({s.experts, 2 * s.intermediate, s.hidden}).requires_grad_(true);
    const at::Tensor down =
        torch::randn({s.experts, s.hidden, s.intermediate}).requires_grad_(true);
    const at::Tensor xl = x.requires_grad_(true), al = act.requires_grad_(true);
    return [=] {
      kernels::grouped_linear(xl, gate_up, offsets).backward(d_gu);
      kernels::grouped_linear(al, down, offsets).backward(d_y);
      for (const at::Tensor& t : {xl, al, gate_up, down}) t.mutable_grad().reset();
    };
  }
  const at::Tensor gate_up = torch::randn({2 * s.intermediate, s.hidden});
  const at::Tensor down = torch::randn({s.hidden, s.intermediate});
  return [=] {
    // forward, input gradient, weight gradient of each projection
    at::mm(x, gate_up.t()), at::mm(d_gu, gate_up), at::mm(d_gu.t(), x);
    at::mm(act, down.t()), at::mm(d_y, down), at::mm(d_y.t(), act);
  };
}

}  // namespace
}  // namespace ballast::bench

int main(int argc, char** argv) {
  using namespace ballast::bench;
  if (argc != 7) {
    std::fprintf(stderr, "usage: moe_layer_bench TOKENS HIDDEN INTERMEDIATE EXPERTS TOP_K REPS\n");
    return 2;
  }
  const Shape s{std::stoll(argv[1]), std::stoll(argv[2]), std::stoll(argv[3]), std::stoll(argv[4]),
                std::stoll(argv[5])};
  const int reps = std::stoi(argv[6]);
  // The allocator as ballast-train sets it for a rank of its own
  // (KeepActivationsMapped, worker/train/main.cc): freed blocks stay mapped,
  // so a step does not page-fault its (T k, H) rows in again. Without it the
  // page faults were 0.4-0.5 s of a 3.3 s layer step here.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
  torch::manual_seed(0);
  const std::vector<double> t = MedianSeconds(
      {LayerStep(s), ProductsStep(s, /*grouped=*/true), ProductsStep(s, /*grouped=*/false)}, reps);
  const double layer = t[0], grouped = t[1], dense = t[2];
  // FLOPs of the six products: 3 x (2 rows H 2I + 2 rows I H).
  const double flops = 3.0 * 2.0 * s.tokens * s.top_k * 3.0 * s.hidden * s.intermediate;
  std::printf(
      "{\"layer_s\": %.6f, \"grouped_s\": %.6f, \"dense_s\": %.6f, \"expert_flops\": %.6g, "
      "\"threads\": %d}\n",
      layer, grouped, dense, flops, at::get_num_threads());
  return 0;
}
