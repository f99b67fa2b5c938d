// The timing of the GPU benchmarks: the median wall time of synchronised
// runs after one warm-up run (kernel selection, allocator, caches).
#ifndef BALLAST_BENCH_GPU_MEDIAN_TIME_H_
#define BALLAST_BENCH_GPU_MEDIAN_TIME_H_

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace ballast::bench {

// Seconds: the median of `reps` runs of `run`, each followed by a device
// synchronisation, after one untimed run.
inline double MedianSeconds(const std::function<void()>& run, int reps) {
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

#endif  // BALLAST_BENCH_GPU_MEDIAN_TIME_H_
