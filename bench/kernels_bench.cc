// Kernel benchmarks against ATen, side by side in one run (`make bench`).
//
// Rows, each a ratio against the named baseline measured in the same run:
//   attention_cpu/causal     kernels::attention, causal, one document, vs
//                            at::scaled_dot_product_attention(is_causal=true)
//   attention_cpu/packed     kernels::attention over 8 documents of one packed
//                            row (cu_seqlens) vs SDPA with the dense (T, T)
//                            block-diagonal causal bool mask that frameworks
//                            build for packing; building the mask is part of
//                            the baseline's time and memory, as it is per step
//   linear_cross_entropy     kernels::linear_cross_entropy vs
//                            at::cross_entropy(at::mm(hidden, W^T)), sum
//                            reduction, gradients for hidden and W
// All fp32 on CPU with LibTorch's default thread count. Attention inputs use
// each side's natural layout: (T, H, D) for ours, (1, H, T, D) for SDPA.
//
// Method. Every measurement runs in a fresh child process (this binary
// re-executed with --child), so allocator state and one-time initialisation
// of one case never reach another. The child builds its inputs, warms the op
// up on a small problem, resets the kernel's peak-RSS counter (writing 5 to
// /proc/self/clear_refs), runs the forward and then the backward once, and
// reports the wall time of each with VmRSS before and VmHWM after each phase.
// Peak memory is VmHWM minus the VmRSS before the forward: what the op adds on
// top of its inputs, the autograd graph and the gradients included. Baseline
// and ours alternate, the first side swapping every repetition, and each side
// reports the median over repetitions, because the machine is shared.
//
// Usage: ballast_kernel_bench [--filter SUBSTRING] [--reps N] [--clock wall|cpu]
//   --reps overrides every case's repetition count (default: per case, more
//   for the small cases, one for the 32k attention and the cross-entropy).
//   --clock cpu times each phase by the process's CPU time (all its threads,
//   user and system) instead of the wall clock: on a machine whose cores other
//   jobs share, wall time measures the other jobs as much as the op. Run it
//   with OMP_NUM_THREADS=1, or idle threads spinning at a barrier count too.
#include <ATen/ATen.h>
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/loss.h"

namespace ballast::bench {
namespace {

// kCausal: one document; kPacked: docs in one row, SDPA with the dense
// document mask; kBatched: docs of equal length, SDPA over them as a batch
// (how transformers runs a batch of rows without padding).
enum class Kind { kCausal, kPacked, kBatched, kLinearCrossEntropy };

struct Case {
  std::string name;  // row prefix
  Kind kind;
  int64_t tokens;  // T
  int64_t heads;   // attention: H; linear cross-entropy: hidden size
  int64_t dim;     // attention: head dim D; linear cross-entropy: vocabulary V
  int64_t docs;    // packed, batched: documents in the row
  int reps;
  bool backward;     // also run and report forward + backward
  std::string note;  // printed after the row
};

// Heads and repetitions shrink as T grows: the cost grows as T^2 H D, and the
// whole run should stay near 6 minutes on 2 cores. Never fewer heads than
// threads: SDPA's CPU backward splits its work over batch x heads only, so
// with H = 1 it runs on one thread (measured at 32k: 3-7x slower than ours).
std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (int64_t t : {4096, 16384, 32768}) {
    const int64_t heads = t == 4096 ? 4 : 2;
    const int reps = t == 4096 ? 3 : (t == 16384 ? 2 : 1);
    for (int64_t d : {64, 128}) {
      cases.push_back({"attention_cpu/causal T=" + std::to_string(t) +
                           " H=" + std::to_string(heads) + " D=" + std::to_string(d),
                       Kind::kCausal, t, heads, d, 1, reps, true, ""});
    }
  }
  cases.push_back({"attention_cpu/packed 8 docs T=16384 H=2 D=64", Kind::kPacked, 16384, 2, 64, 8,
                   2, true, ""});
  // The trainer benchmark's attention (bench/trainer_vs_peft.py): 4 rows of 512, 8 heads of 32.
  cases.push_back(
      {"attention_cpu/4 rows of 512 H=8 D=32", Kind::kBatched, 2048, 8, 32, 4, 21, true, ""});
  cases.push_back({"linear_cross_entropy/T=4096 H=1024 V=151936", Kind::kLinearCrossEntropy, 4096,
                   1024, 151936, 1, 1, true, ""});
  // The trainer benchmark's shape (bench/trainer_vs_peft.py): a small vocabulary.
  cases.push_back({"linear_cross_entropy/T=2048 H=256 V=4096", Kind::kLinearCrossEntropy, 2048, 256,
                   4096, 1, 5, true, ""});
  return cases;
}

// ---------------------------------------------------------------------------
// Child: one measurement
// ---------------------------------------------------------------------------

// A field of /proc/self/status in KiB.
int64_t StatusKiB(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

void ResetPeakRss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

// Wall and CPU seconds since a start.
struct Clocks {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  double cpu = ProcessCpuSeconds();

  static double ProcessCpuSeconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  }
  double WallSince() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
  }
  double CpuSince() const { return ProcessCpuSeconds() - cpu; }
};

// The op under test, split so that the forward and the backward are timed apart.
struct Op {
  std::function<at::Tensor()> forward;  // returns what backward() starts from
  std::function<void(const at::Tensor&)> backward;
};

at::Tensor CuSeqlens(int64_t tokens, int64_t docs) {
  return at::arange(0, tokens + 1, tokens / docs, at::kLong);
}

// The block-diagonal causal mask frameworks build for packed rows: (T, T) bool,
// true where query i may see key j (same document, j <= i).
at::Tensor DenseDocumentMask(int64_t tokens, int64_t docs) {
  const at::Tensor pos = at::arange(tokens, at::kLong);
  const at::Tensor doc = pos.div(tokens / docs, "floor");
  return doc.unsqueeze(1).eq(doc.unsqueeze(0)).logical_and_(pos.unsqueeze(1).ge(pos.unsqueeze(0)));
}

Op AttentionOp(const Case& c, bool ours, int64_t tokens) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.dim));
  const int64_t docs = c.kind == Kind::kCausal ? 1 : c.docs;
  const int64_t batch = c.kind == Kind::kBatched ? docs : 1;
  const auto sizes = ours ? std::vector<int64_t>{tokens, c.heads, c.dim}
                          : std::vector<int64_t>{batch, c.heads, tokens / batch, c.dim};
  at::Tensor q = torch::randn(sizes).requires_grad_();
  at::Tensor k = torch::randn(sizes).requires_grad_();
  at::Tensor v = torch::randn(sizes).requires_grad_();
  at::Tensor grad_out = torch::randn(sizes);
  Op op;
  op.backward = [=](const at::Tensor& out) { out.backward(grad_out); };
  if (ours) {
    kernels::AttentionMask mask;
    mask.kind = kernels::MaskKind::kCausal;
    mask.cu_seqlens = CuSeqlens(tokens, docs);
    op.forward = [=] { return kernels::attention(q, k, v, mask, scale); };
  } else if (c.kind != Kind::kPacked) {
    op.forward = [=] {
      return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true, scale);
    };
  } else {
    op.forward = [=] {
      return at::scaled_dot_product_attention(q, k, v, DenseDocumentMask(tokens, docs), 0.0,
                                              /*is_causal=*/false, scale);
    };
  }
  return op;
}

Op LinearCrossEntropyOp(const Case& c, bool ours, int64_t tokens) {
  const int64_t hidden_size = c.heads;
  const int64_t vocab = c.dim;
  // Logits with a standard deviation of about 0.6, like a trained lm_head's.
  at::Tensor hidden = torch::randn({tokens, hidden_size}).requires_grad_();
  at::Tensor weight = (torch::randn({vocab, hidden_size}) * 0.02).requires_grad_();
  at::Tensor targets = torch::randint(vocab, {tokens}, at::kLong);
  Op op;
  op.backward = [](const at::Tensor& loss) { loss.backward(); };
  if (ours) {
    op.forward = [=] { return kernels::linear_cross_entropy(hidden, weight, targets).sum; };
  } else {
    op.forward = [=] {
      return at::cross_entropy_loss(at::mm(hidden, weight.t()), targets, {}, at::Reduction::Sum);
    };
  }
  return op;
}

Op MakeOp(const Case& c, bool ours, int64_t tokens) {
  return c.kind == Kind::kLinearCrossEntropy ? LinearCrossEntropyOp(c, ours, tokens)
                                             : AttentionOp(c, ours, tokens);
}

// Prints "fwd_s bwd_s fwd_cpu_s bwd_cpu_s rss_kib fwd_hwm_kib end_hwm_kib"
// (the bwd fields 0 without backward).
int RunChild(const Case& c, bool ours) {
  torch::manual_seed(0);
  {
    // One-time costs (thread pool, BLAS buffers, first-use dispatch) on a small
    // problem, so that they do not count as the case's time or memory.
    Op warm = MakeOp(c, ours, c.kind == Kind::kLinearCrossEntropy ? 64 : 256 * c.docs);
    warm.backward(warm.forward());
  }
  Op op = MakeOp(c, ours, c.tokens);
  ResetPeakRss();
  const int64_t rss = StatusKiB("VmRSS");
  Clocks start;
  at::Tensor out = op.forward();
  const double fwd = start.WallSince(), fwd_cpu = start.CpuSince();
  const int64_t fwd_hwm = StatusKiB("VmHWM");
  double bwd = 0, bwd_cpu = 0;
  if (c.backward) {
    start = Clocks();
    op.backward(out);
    bwd = start.WallSince();
    bwd_cpu = start.CpuSince();
  }
  const int64_t end_hwm = StatusKiB("VmHWM");
  std::printf("%.6f %.6f %.6f %.6f %lld %lld %lld\n", fwd, bwd, fwd_cpu, bwd_cpu,
              static_cast<long long>(rss), static_cast<long long>(fwd_hwm),
              static_cast<long long>(end_hwm));
  return 0;
}

// ---------------------------------------------------------------------------
// Driver
// ---------------------------------------------------------------------------

struct Sample {
  double fwd_s = 0, bwd_s = 0;
  double fwd_mib = 0, total_mib = 0;  // peak growth over the forward, and over both phases
};

std::optional<Sample> Measure(const std::string& exe, size_t index, bool ours, bool cpu_clock) {
  const std::string cmd =
      "'" + exe + "' --child " + std::to_string(index) + (ours ? " ours" : " baseline");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  char line[256] = {};
  const bool got = std::fgets(line, sizeof line, pipe) != nullptr;
  const int status = pclose(pipe);
  if (!got || status != 0) return std::nullopt;
  double fwd, bwd, fwd_cpu, bwd_cpu;
  long long rss, fwd_hwm, end_hwm;
  if (std::sscanf(line, "%lf %lf %lf %lf %lld %lld %lld", &fwd, &bwd, &fwd_cpu, &bwd_cpu, &rss,
                  &fwd_hwm, &end_hwm) != 7) {
    return std::nullopt;
  }
  return Sample{cpu_clock ? fwd_cpu : fwd, cpu_clock ? bwd_cpu : bwd, (fwd_hwm - rss) / 1024.0,
                (end_hwm - rss) / 1024.0};
}

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  const size_t n = x.size();
  return n % 2 == 1 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::string Fixed(double x, int digits) {
  std::ostringstream s;
  s.precision(digits);
  s << std::fixed << x;
  return s.str();
}

// "0.62x time (1.23 vs 1.98 s), 0.03x peak memory (12 vs 400 MiB)"
std::string Ratios(double ours_s, double base_s, double ours_mib, double base_mib) {
  // Growth below a page of noise is reported as 1 MiB so that the ratio stays defined.
  ours_mib = std::max(ours_mib, 1.0);
  base_mib = std::max(base_mib, 1.0);
  // Times under 0.1 s (the trainer-shape cases) keep four decimals.
  const int digits = std::min(ours_s, base_s) < 0.1 ? 4 : 2;
  return Fixed(ours_s / base_s, 2) + "x time (" + Fixed(ours_s, digits) + " vs " +
         Fixed(base_s, digits) + " s), " + Fixed(ours_mib / base_mib, 3) + "x peak memory (" +
         Fixed(ours_mib, 0) + " vs " + Fixed(base_mib, 0) + " MiB)";
}

int RunDriver(const std::string& exe, const std::string& filter, int reps_override,
              bool cpu_clock) {
  const std::vector<Case> cases = Cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (!filter.empty() && c.name.find(filter) == std::string::npos) continue;
    const std::string baseline = c.kind == Kind::kLinearCrossEntropy ? "aten_mm_cross_entropy"
                                 : c.kind == Kind::kPacked           ? "aten_sdpa_dense_mask"
                                                                     : "aten_sdpa";
    const int reps = reps_override > 0 ? reps_override : c.reps;
    std::vector<Sample> ours, base;
    std::string failed;
    for (int r = 0; r < reps && failed.empty(); ++r) {
      for (int side = 0; side < 2; ++side) {
        const bool is_ours = (side + r) % 2 == 1;
        std::optional<Sample> s = Measure(exe, i, is_ours, cpu_clock);
        if (!s) {
          failed = is_ours ? "ours" : baseline;
          break;
        }
        (is_ours ? ours : base).push_back(*s);
      }
    }
    const std::string suffix = " (" + std::to_string(reps) + (reps == 1 ? " run" : " runs") +
                               (cpu_clock ? ", CPU time" : "") +
                               (c.note.empty() ? ")" : "; " + c.note + ")");
    if (!failed.empty()) {
      std::cout << c.name << " vs " << baseline << ": not measured, " << failed
                << " failed (out of memory?)" << suffix << std::endl;
      continue;
    }
    auto median = [](const std::vector<Sample>& v, auto field) {
      std::vector<double> x;
      for (const Sample& s : v) x.push_back(field(s));
      return Median(x);
    };
    auto fwd = [](const Sample& s) { return s.fwd_s; };
    auto total = [](const Sample& s) { return s.fwd_s + s.bwd_s; };
    auto fwd_mib = [](const Sample& s) { return s.fwd_mib; };
    auto total_mib = [](const Sample& s) { return s.total_mib; };
    if (c.kind != Kind::kLinearCrossEntropy) {
      std::cout << c.name << " fwd vs " << baseline << ": "
                << Ratios(median(ours, fwd), median(base, fwd), median(ours, fwd_mib),
                          median(base, fwd_mib))
                << suffix << std::endl;
    }
    if (c.backward) {
      std::cout << c.name << " fwd+bwd vs " << baseline << ": "
                << Ratios(median(ours, total), median(base, total), median(ours, total_mib),
                          median(base, total_mib))
                << suffix << std::endl;
    }
  }
  return 0;
}

}  // namespace
}  // namespace ballast::bench

int main(int argc, char** argv) {
  using namespace ballast::bench;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() == 3 && args[0] == "--child") {
    const std::vector<Case> cases = Cases();
    const size_t index = std::stoul(args[1]);
    if (index >= cases.size()) return 2;
    return RunChild(cases[index], args[2] == "ours");
  }
  const char* usage =
      "usage: ballast_kernel_bench [--filter SUBSTRING] [--reps N] [--clock wall|cpu]\n";
  std::string filter;
  int reps = 0;
  bool cpu_clock = false;
  for (size_t i = 0; i + 1 < args.size(); i += 2) {
    if (args[i] == "--filter") {
      filter = args[i + 1];
    } else if (args[i] == "--reps") {
      reps = std::stoi(args[i + 1]);
    } else if (args[i] == "--clock" && (args[i + 1] == "wall" || args[i + 1] == "cpu")) {
      cpu_clock = args[i + 1] == "cpu";
    } else {
      std::cerr << usage;
      return 2;
    }
  }
  if (args.size() % 2 != 0) {
    std::cerr << usage;
    return 2;
  }
  // The children are this very binary, whatever its path.
  return RunDriver(std::filesystem::read_symlink("/proc/self/exe").string(), filter, reps,
                   cpu_clock);
}
