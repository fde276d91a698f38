// Host side of the tile-layer GPU tests (tile_test.cu, tile_row_test.cu): storage-type bits and
// values computed with the host conversions of cuda_fp16.h / cuda_bf16.h, and buffer copies.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/check.hpp"
#include "runtime/memory.hpp"
#include "tile/frag.cuh"

namespace tessera::tile_testing {

using runtime::DeviceBuffer;

// Element e's bits alone. tile::element_bits leaves element e + 1 in the high half of an even
// element's word where T is 16-bit (its callers truncate to T), so the tests mask to T's width.
template <class T, int V>
__device__ __forceinline__ uint32_t elem_bits(const tile::Frag<T, V>& f, int e) {
  const uint32_t b = tile::element_bits(f, e);
  return sizeof(T) == 4 ? b : b & 0xffffu;
}

// x rounded to nearest even in T, as T's bits (in the low bits).
template <class T>
uint32_t host_bits(float x) {
  uint32_t b = 0;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&b, &x, 4);
  } else if constexpr (std::is_same_v<T, __half>) {
    const __half h = __float2half_rn(x);
    std::memcpy(&b, &h, 2);
  } else {
    const __nv_bfloat16 h = __float2bfloat16_rn(x);
    std::memcpy(&b, &h, 2);
  }
  return b;
}

// The float value of T's element with bits b.
template <class T>
float host_float(uint32_t b) {
  float f;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&f, &b, 4);
  } else if constexpr (std::is_same_v<T, __half>) {
    __half h;
    const uint16_t s = static_cast<uint16_t>(b);
    std::memcpy(&h, &s, 2);
    f = __half2float(h);
  } else {
    __nv_bfloat16 h;
    const uint16_t s = static_cast<uint16_t>(b);
    std::memcpy(&h, &s, 2);
    f = __bfloat162float(h);
  }
  return f;
}

template <class T> float host_round(float x) { return host_float<T>(host_bits<T>(x)); }

// What poison() leaves in one element of T.
template <class T> constexpr uint32_t poison_bits() { return sizeof(T) == 4 ? 0xffffffffu : 0xffffu; }

template <class T> std::string type_name() {
  return std::is_same_v<T, float> ? "float" : std::is_same_v<T, __half> ? "half" : "bfloat16";
}

inline uint32_t float_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}

// Elements of T from their bits (the low sizeof(T) bytes of each word).
template <class T>
DeviceBuffer device_elements(const std::vector<uint32_t>& bits) {
  std::vector<unsigned char> bytes(bits.size() * sizeof(T));
  for (size_t i = 0; i < bits.size(); ++i) std::memcpy(&bytes[i * sizeof(T)], &bits[i], sizeof(T));
  DeviceBuffer d(bytes.size() + 16);
  TESSERA_CUDA_CHECK(cudaMemcpy(d.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  return d;
}

// The bits of n elements of T at d.
template <class T>
std::vector<uint32_t> element_bits_of(const DeviceBuffer& d, size_t n) {
  std::vector<unsigned char> bytes(n * sizeof(T));
  TESSERA_CUDA_CHECK(cudaMemcpy(bytes.data(), d.data(), bytes.size(), cudaMemcpyDeviceToHost));
  std::vector<uint32_t> bits(n, 0);
  for (size_t i = 0; i < n; ++i) std::memcpy(&bits[i], &bytes[i * sizeof(T)], sizeof(T));
  return bits;
}

template <class X>
DeviceBuffer to_device(const std::vector<X>& h) {
  DeviceBuffer d(h.size() * sizeof(X) + 16);
  TESSERA_CUDA_CHECK(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(X), cudaMemcpyHostToDevice));
  return d;
}

template <class X>
std::vector<X> from_device(const DeviceBuffer& d, size_t n) {
  std::vector<X> h(n);
  TESSERA_CUDA_CHECK(cudaMemcpy(h.data(), d.data(), n * sizeof(X), cudaMemcpyDeviceToHost));
  return h;
}

template <class X> X* ptr(const DeviceBuffer& d) { return static_cast<X*>(d.data()); }

// Every byte 0xFF (NaN in every float type; poison_bits per element), before a kernel writes.
inline void poison(const DeviceBuffer& d) { TESSERA_CUDA_CHECK(cudaMemset(d.data(), 0xFF, d.bytes())); }

// Deterministic pseudo-random numbers for test inputs.
struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() % 1000003) / 1000003.0f; }
  int integer(int lo, int hi) { return lo + static_cast<int>(next() % static_cast<uint32_t>(hi - lo + 1)); }
};

}  // namespace tessera::tile_testing
