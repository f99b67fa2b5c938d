// The GPU benchmarks' timer: the median wall time of a synchronised run.
#ifndef BALLAST_BENCH_GPU_MEDIAN_SECONDS_H_
#define BALLAST_BENCH_GPU_MEDIAN_SECONDS_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace ballast::bench {

// The median of `reps` runs of `run`, each followed by a device
// synchronisation, after one untimed warm-up run.
inline double MedianSeconds(const std::function<void()>& run, int reps = 5) {
  run();
  torch::cuda::synchronize();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    torch::cuda::synchronize();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[reps / 2];
}

}  // namespace ballast::bench

#endif  // BALLAST_BENCH_GPU_MEDIAN_SECONDS_H_
