// cp.async (sm_80 on): copies from global into shared memory that hold no registers on the way,
// in groups that a thread commits and later waits for, so a ring of stages fills while the
// previous ones are read.
#pragma once

#include <cstdint>

namespace tessera::tile {

// The shared-memory address of a generic pointer into shared memory, as PTX takes it.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Size (16 or 4) bytes to shared `dst` of which the first `bytes` (0 to Size) come from global
// `src`, the rest zeros. 16 bytes bypass L1 (.cg); 4 bytes go through it (.ca, the only form of
// that size). Traps below sm_80: callers plan around it.
template <int Size = 16>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int bytes) {
  static_assert(Size == 16 || Size == 4, "cp.async of 16 or 4 bytes");
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  if constexpr (Size == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
#else
  __trap();
#endif
}

// Closes this thread's group of copies (an empty group too: waits count groups).
__device__ __forceinline__ void cp_async_commit() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Returns once at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

}  // namespace tessera::tile
