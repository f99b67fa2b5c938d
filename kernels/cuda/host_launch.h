// The host side of kernels/cuda/block_program.h: runs a block program on
// the CPU, for the tests of the CUDA kernels' bodies (C++20, so kept out of
// the headers that nvcc compiles).
#ifndef BALLAST_KERNELS_CUDA_HOST_LAUNCH_H_
#define BALLAST_KERNELS_CUDA_HOST_LAUNCH_H_

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "kernels/cuda/block_program.h"

namespace ballast::kernels::block_program {

// One thread of a block on the host. With threads() == 1 sync() does
// nothing; with more, the threads share smem and sync() is their barrier.
struct HostBlock {
  float* smem;
  int thread = 0, team = 1;
  std::barrier<>* barrier = nullptr;
  int tid() const { return thread; }
  int threads() const { return team; }
  void sync() const {
    if (team > 1) barrier->arrive_and_wait();
  }
};

// Runs a body over its grid on the host, block after block, each block by
// `threads` threads (the calling one alone by default), with a fresh
// (NaN-filled, so that a read of something never written shows) shared
// memory of `smem_floats` per block. Several threads exercise the bodies'
// division of work and their barriers as a GPU block would, though a
// missing barrier shows only when the threads happen to race.
struct HostLaunch {
  int threads = 1;

  template <class Body>
  void operator()(Grid grid, int64_t smem_floats, const Body& body) const {
    std::vector<float> smem(static_cast<size_t>(smem_floats));
    std::barrier<> barrier(threads);
    auto run = [&](int tid) {
      const HostBlock block{smem.data(), tid, threads, &barrier};
      for (int64_t z = 0; z < grid.z; ++z)
        for (int64_t y = 0; y < grid.y; ++y)
          for (int64_t x = 0; x < grid.x; ++x) {
            if (tid == 0)
              std::fill(smem.begin(), smem.end(), std::numeric_limits<float>::quiet_NaN());
            block.sync();
            body(block, x, y, z);
            block.sync();
          }
    };
    std::vector<std::thread> team;
    for (int tid = 1; tid < threads; ++tid) team.emplace_back(run, tid);
    run(0);
    for (std::thread& t : team) t.join();
  }
};

}  // namespace ballast::kernels::block_program

#endif  // BALLAST_KERNELS_CUDA_HOST_LAUNCH_H_
