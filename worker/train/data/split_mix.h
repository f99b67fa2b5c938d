// SplitMix64 (Steele, Lea and Flood 2014): the data pipeline's one source of
// pseudo-random numbers, a pure function of its state, so that every draw
// (an epoch's permutation, a document's diffusion mask) follows from the
// job seed and a position alone, on any machine and at any world size.
#ifndef BALLAST_WORKER_TRAIN_DATA_SPLIT_MIX_H_
#define BALLAST_WORKER_TRAIN_DATA_SPLIT_MIX_H_

#include <cstdint>

namespace ballast::train {

// The next 64 random bits; advances `state`.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1), from 53 random bits.
inline double SplitMixUniform(uint64_t& state) {
  return static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
}

}  // namespace ballast::train

#endif  // BALLAST_WORKER_TRAIN_DATA_SPLIT_MIX_H_
