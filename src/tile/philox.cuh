// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC'11): four 32-bit words from a 128-bit counter and a 64-bit key, with no state.
// Any thread can draw the numbers of any counter directly, so an operator that derives its
// counters from element indices gets the same numbers whatever the launch shape, and a backward
// pass regenerates a mask instead of storing it.
//
// One call is ten rounds of two 32x32->64-bit multiplies and a few XORs. The key schedule (the key
// of each round) is the same for every thread of a launch, so kernels precompute it on the host
// and pass it as a kernel parameter: the round keys then come from the constant bank as operands
// of the XORs instead of being added up again in every call.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tessera::tile {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // round multipliers
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key increments (golden ratio, sqrt(3) - 1)
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
inline constexpr int kPhiloxRounds = 10;

// The round keys of one 64-bit key: k[r] = key + r * (W0, W1), word by word modulo 2^32.
struct PhiloxKeys {
  uint32_t k[kPhiloxRounds][2];
};

__host__ __device__ inline PhiloxKeys philox_key_schedule(uint64_t key) {
  PhiloxKeys s;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    s.k[r][0] = k0;
    s.k[r][1] = k1;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return s;
}

// Counter words for a 64-bit counter value: low word first, upper two words 0.
__device__ __forceinline__ uint4 philox_counter(uint64_t c) {
  return make_uint4(static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32), 0u, 0u);
}

// Fully unrolled and branch-free: each round is two wide multiplies and two three-input XORs
// (LOP3). A constant-zero counter word (philox_counter's upper words) folds the first round's
// second multiply away.
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, const PhiloxKeys& keys) {
#pragma unroll
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * c.x;
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * c.z;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c = make_uint4(hi1 ^ c.y ^ keys.k[r][0], lo1, hi0 ^ c.w ^ keys.k[r][1], lo0);
  }
  return c;
}

// The same with the key schedule computed in the call (for kernels that draw only a few numbers).
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint64_t key) {
  return philox4x32_10(c, philox_key_schedule(key));
}

// The top 24 bits of a word as a float uniform on [0, 1): every value is exact in float, so a
// comparison with a float probability has no rounding in it.
__device__ __forceinline__ float philox_uniform(uint32_t w) {
  return static_cast<float>(w >> 8) * (1.0f / 16777216.0f);
}

// Threshold t with philox_uniform(w) >= p exactly when w >= t, for a float p in [0, 1): the
// uniform is (w >> 8) * 2^-24, so the comparison holds when w >> 8 >= ceil(p * 2^24) (p * 2^24 is
// exact in float), i.e. when w >= 256 * ceil(p * 2^24) <= 2^32 - 256. One integer compare per
// element instead of a shift, a conversion and a float compare. p = 1 (no word passes) has no
// 32-bit threshold: callers handle it apart.
__host__ __device__ inline uint32_t philox_uniform_threshold(float p) {
  const float scaled = p * 16777216.0f;
  auto t = static_cast<uint32_t>(scaled);
  if (static_cast<float>(t) < scaled) ++t;  // ceil
  return t << 8;
}

}  // namespace tessera::tile
