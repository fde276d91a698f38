// A kernel's dynamic shared memory as a struct, aligned (the 128-byte swizzle of TMA and wgmma
// tiles needs 1024 bytes). The alignment is an offset from the extern array itself, not a round
// trip through an integer: after such a round trip the compiler no longer knows the pointer is to
// shared memory and emits generic loads and stores (slower, and waited on as global ones).
#pragma once

#include <cstdint>

namespace tessera::tile {

// `raw` is the kernel's `extern __shared__` array, allocated Align - 1 bytes larger than T.
template <class T, uint32_t Align>
__device__ __forceinline__ T& aligned_smem(unsigned char* raw) {
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return *reinterpret_cast<T*>(raw + (Align - base % Align) % Align);
}

// The byte offset of byte `b` (< 128) of row `row` in a tile of 128-byte rows laid out in the
// copy engine's 128-byte swizzle (TmaSwizzle::b128): the row's 16-byte chunks permuted by the
// row's position in its group of 8, which puts 8 rows' same chunk on distinct banks.
__device__ __forceinline__ uint32_t sw128_offset(uint32_t row, uint32_t b) {
  return row * 128 + ((((b >> 4) ^ row) & 7) << 4) + (b & 15);
}

}  // namespace tessera::tile
