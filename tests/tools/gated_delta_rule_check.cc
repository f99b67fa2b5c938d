// gated_delta_rule_check: the Gated DeltaNet kernels (kernels/gated_delta_rule.h,
// kernels/causal_conv1d.h) over safetensors files, for the parity test against
// fla and transformers (tests/parity/test_gated_delta_rule_fla.py), and their
// CPU benchmark (bench/gated_delta_rule.py).
//
//   gated_delta_rule_check run IN.safetensors OUT.safetensors [--aten]
//     IN:  q, k (T, Hk, Dk), v (T, Hv, Dv), g, beta (T, Hv), cu_seqlens int64
//          (N + 1), and optionally initial_state (N, Hv, Dk, Dv); d_out and
//          d_final_state, the gradients of out and final_state (zeros when
//          absent); x (T, C), conv_weight (C, K), conv_window (N, C, K - 1)
//          optional, d_y. Metadata "scale" (default Dk^-0.5). The GDN tensors
//          and the conv tensors are each optional as a group.
//     OUT: out, final_state, d_q, d_k, d_v, d_g, d_beta, d_initial_state;
//          y, d_x, d_conv_weight, d_conv_window.
//     --aten runs the op-by-op path instead of the CPU kernel.
//
//   gated_delta_rule_check bench TOKENS [HK HV DK DV REPS]
//     One document of random inputs (defaults 2, 4, 128, 128, 3), forward and
//     backward of out.sum(), one untimed step on the first 1024 tokens (the
//     thread pools' start) then REPS timed ones on all: prints
//     {"tokens", "seconds" (the median), "peak_bytes" (the timed steps' peak
//     resident memory above the resident memory before them, from
//     /proc/self/status after a reset of VmHWM), "threads"}. Run it with
//     MALLOC_MMAP_THRESHOLD_=65536 for a peak of what is live (as
//     bench/gated_delta_rule.py does).
// Exit code 2 on bad arguments or unreadable files, with the reason on stderr.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/causal_conv1d.h"
#include "kernels/gated_delta_rule.h"
#include "worker/train/io/safetensors.h"

namespace {

using ballast::kernels::GatedDeltaRuleOutput;

int Fail(const std::string& message) {
  std::cerr << "gated_delta_rule_check: " << message << "\n";
  return 2;
}

// A leaf that requires grad, or undefined.
at::Tensor Leaf(const std::map<std::string, at::Tensor>& in, const std::string& name) {
  auto it = in.find(name);
  if (it == in.end()) return at::Tensor();
  return it->second.clone().requires_grad_(true);
}

at::Tensor Get(const std::map<std::string, at::Tensor>& in, const std::string& name) {
  auto it = in.find(name);
  return it == in.end() ? at::Tensor() : it->second;
}

at::Tensor GradOrZeros(const at::Tensor& leaf) {
  if (!leaf.defined()) return at::Tensor();
  return leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf);
}

int Run(const std::string& in_path, const std::string& out_path, bool aten) {
  absl::StatusOr<std::unique_ptr<ballast::train::SafetensorsFile>> file =
      ballast::train::SafetensorsFile::Open(in_path);
  if (!file.ok()) return Fail(file.status().ToString());
  std::map<std::string, at::Tensor> in;
  for (const std::string& name : (*file)->names()) in[name] = (*file)->tensor(name)->clone();
  std::map<std::string, at::Tensor> out;
  if (in.count("q") != 0) {
    at::Tensor q = Leaf(in, "q"), k = Leaf(in, "k"), v = Leaf(in, "v"), g = Leaf(in, "g"),
               beta = Leaf(in, "beta"), state = Leaf(in, "initial_state");
    const at::Tensor cu = Get(in, "cu_seqlens");
    auto scale_it = (*file)->metadata().find("scale");
    const double scale = scale_it != (*file)->metadata().end()
                             ? std::stod(scale_it->second)
                             : 1.0 / std::sqrt(static_cast<double>(q.size(2)));
    const GatedDeltaRuleOutput o =
        aten ? ballast::kernels::gated_delta_rule_aten(q, k, v, g, beta, cu, state, scale)
             : ballast::kernels::gated_delta_rule(q, k, v, g, beta, cu, state, scale);
    at::Tensor loss = o.out.sum() * 0;
    if (in.count("d_out") != 0) loss = loss + (o.out * in["d_out"]).sum();
    if (in.count("d_final_state") != 0) loss = loss + (o.final_state * in["d_final_state"]).sum();
    loss.backward();
    out["out"] = o.out.detach();
    out["final_state"] = o.final_state.detach();
    out["d_q"] = GradOrZeros(q);
    out["d_k"] = GradOrZeros(k);
    out["d_v"] = GradOrZeros(v);
    out["d_g"] = GradOrZeros(g);
    out["d_beta"] = GradOrZeros(beta);
    if (state.defined()) out["d_initial_state"] = GradOrZeros(state);
  }
  if (in.count("x") != 0) {
    at::Tensor x = Leaf(in, "x"), w = Leaf(in, "conv_weight"), window = Leaf(in, "conv_window");
    const at::Tensor cu = Get(in, "cu_seqlens");
    const at::Tensor y = aten ? ballast::kernels::causal_conv1d_silu_aten(x, w, cu, window)
                              : ballast::kernels::causal_conv1d_silu(x, w, cu, window);
    at::Tensor loss = y.sum() * 0;
    if (in.count("d_y") != 0) loss = loss + (y * in["d_y"]).sum();
    loss.backward();
    out["y"] = y.detach();
    out["d_x"] = GradOrZeros(x);
    out["d_conv_weight"] = GradOrZeros(w);
    if (window.defined()) out["d_conv_window"] = GradOrZeros(window);
  }
  absl::Status written = ballast::train::WriteSafetensors(out_path, out);
  if (!written.ok()) return Fail(written.ToString());
  return 0;
}

// A field of /proc/self/status in bytes (VmRSS, VmHWM).
int64_t StatusBytes(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

int Bench(const std::vector<int64_t>& args) {
  const int64_t tokens = args[0], hk = args[1], hv = args[2], dk = args[3], dv = args[4],
                reps = args[5];
  torch::manual_seed(0);
  const at::Tensor q = torch::randn({tokens, hk, dk}).requires_grad_(true);
  const at::Tensor k = torch::randn({tokens, hk, dk}).requires_grad_(true);
  const at::Tensor v = torch::randn({tokens, hv, dv}).requires_grad_(true);
  const at::Tensor g = (-torch::softplus(torch::randn({tokens, hv}))).requires_grad_(true);
  const at::Tensor beta = torch::sigmoid(torch::randn({tokens, hv})).requires_grad_(true);
  // The first n tokens as one document.
  auto step = [&](int64_t n) {
    const GatedDeltaRuleOutput o = ballast::kernels::gated_delta_rule(
        q.narrow(0, 0, n), k.narrow(0, 0, n), v.narrow(0, 0, n), g.narrow(0, 0, n),
        beta.narrow(0, 0, n), torch::tensor({int64_t{0}, n}, torch::kLong), at::Tensor(),
        1.0 / std::sqrt(static_cast<double>(dk)));
    o.out.sum().backward();
    for (const at::Tensor& t : {q, k, v, g, beta}) t.mutable_grad() = at::Tensor();
  };
  step(std::min<int64_t>(tokens, 1024));
  // Writing 5 to clear_refs resets VmHWM to the current resident size.
  { std::ofstream("/proc/self/clear_refs") << "5"; }
  const int64_t before = StatusBytes("VmRSS");
  std::vector<double> seconds;
  for (int64_t r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    step(tokens);
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const int64_t peak = StatusBytes("VmHWM") - before;
  std::sort(seconds.begin(), seconds.end());
  std::cout << "{\"tokens\": " << tokens << ", \"seconds\": " << seconds[seconds.size() / 2]
            << ", \"peak_bytes\": " << peak << ", \"threads\": " << at::get_num_threads() << "}\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 3 && args[0] == "run") {
      return Run(args[1], args[2], args.size() > 3 && args[3] == "--aten");
    }
    if (args.size() >= 2 && args[0] == "bench") {
      std::vector<int64_t> sizes = {0, 2, 4, 128, 128, 3};
      for (size_t i = 1; i < args.size() && i <= sizes.size(); ++i)
        sizes[i - 1] = std::stoll(args[i]);
      if (sizes[0] < 1 || sizes[5] < 1) return Fail("bench needs TOKENS >= 1 and REPS >= 1");
      return Bench(sizes);
    }
  } catch (const std::exception& e) {
    return Fail(e.what());
  }
  return Fail(
      "usage: gated_delta_rule_check run IN.safetensors OUT.safetensors [--aten] | "
      "bench TOKENS [HK HV DK DV REPS]");
}
