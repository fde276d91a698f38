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

}  // namespace tessera::tile
