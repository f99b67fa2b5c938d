// Eight-float vectors for the CPU row kernels, in GCC's vector extension, and
// the exp they share.
//
// The baseline build targets any x86-64. A row kernel marked
// BALLAST_ROW_KERNEL is compiled twice, for AVX2 + FMA and for the baseline,
// and the loader picks the body the CPU can run, as ATen does for its own
// kernels. The helpers below are always inlined, so each clone gets them in
// its own instruction set (and GCC's -Wpsabi note about passing 32-byte
// vectors by value, which only concerns calls across object files, is off for
// kernels/, see its CMakeLists.txt).
#ifndef BALLAST_KERNELS_CPU_VEC8_H_
#define BALLAST_KERNELS_CPU_VEC8_H_

#include <cstdint>
#include <cstring>

namespace ballast::kernels {

#if defined(__x86_64__) && defined(__GNUC__)
#define BALLAST_ROW_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BALLAST_ROW_KERNEL
#endif
#define BALLAST_VEC_INLINE inline __attribute__((always_inline))

inline constexpr int64_t kVec = 8;
using Vec8f = float __attribute__((vector_size(32)));
using Vec8i = int32_t __attribute__((vector_size(32)));
static_assert(sizeof(Vec8f) == kVec * sizeof(float));

BALLAST_VEC_INLINE Vec8f Load8(const float* p) {
  Vec8f x;
  std::memcpy(&x, p, sizeof x);
  return x;
}

BALLAST_VEC_INLINE void Store8(float* p, Vec8f x) { std::memcpy(p, &x, sizeof x); }

// The sum of the lanes, in lane order.
BALLAST_VEC_INLINE float HorizontalSum(Vec8f v) {
  float total = 0.0f;
  for (int64_t t = 0; t < kVec; ++t) total += v[t];
  return total;
}

// The first n < kVec floats of p, the other lanes `fill`.
BALLAST_VEC_INLINE Vec8f LoadPartial8(const float* p, int64_t n, float fill) {
  Vec8f x = Vec8f{} + fill;
  for (int64_t t = 0; t < n; ++t) x[t] = p[t];
  return x;
}

BALLAST_VEC_INLINE void StorePartial8(float* p, Vec8f x, int64_t n) {
  for (int64_t t = 0; t < n; ++t) p[t] = x[t];
}

// exp(x) in every lane, within 1e-7 relative of expf. exp(x) = 2^r exp(f) with
// r = round(x / ln 2) and f = x - r ln 2 in [-ln2/2, ln2/2] (Cody-Waite, ln 2
// split in two so that r * ln2_hi is exact), exp(f) by a degree-7 polynomial.
// Below -87.33, where exp is subnormal in fp32, the result is 0; above 88.37
// (2^127.5, where 2^r would no longer fit the exponent field) it is +inf,
// slightly before expf overflows at 88.72; -inf gives exactly 0 and NaN stays
// NaN, so a poisoned input reaches the output.
//
// For any width: V a float vector and I its int32 twin (Vec8f and Vec8i here;
// the attention softmax also runs it on 16 floats, in a function built for
// AVX-512).
template <typename V, typename I>
BALLAST_VEC_INLINE V ExpLanes(V x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  // Adding then subtracting 1.5 * 2^23 rounds to the nearest integer.
  constexpr float kRound = 12582912.0f;
  constexpr float kMinArg = -87.33f;
  constexpr float kMaxArg = 88.37f;
  V xc = x < kMinArg ? V{} + kMinArg : x;
  xc = xc > kMaxArg ? V{} + kMaxArg : xc;
  const V r = (xc * kLog2e + kRound) - kRound;
  const V f = (xc - r * kLn2Hi) - r * kLn2Lo;
  V p = V{} + 1.9875691500e-4f;
  p = p * f + 1.3981999507e-3f;
  p = p * f + 8.3334519073e-3f;
  p = p * f + 4.1665795894e-2f;
  p = p * f + 1.6666665459e-1f;
  p = p * f + 5.0000001201e-1f;
  p = p * f * f + f + 1.0f;
  // Multiply by 2^r by adding r to the exponent bits (GCC's reinterpret_cast
  // of a vector keeps its bits).
  const I bits = reinterpret_cast<I>(p) + (__builtin_convertvector(r, I) << 23);
  V y = reinterpret_cast<V>(bits);
  y = x < kMinArg ? V{} : y;
  y = x > kMaxArg ? V{} + __builtin_inff() : y;
  return x != x ? x : y;
}

BALLAST_VEC_INLINE Vec8f Exp8(Vec8f x) { return ExpLanes<Vec8f, Vec8i>(x); }

}  // namespace ballast::kernels

#endif  // BALLAST_KERNELS_CPU_VEC8_H_
