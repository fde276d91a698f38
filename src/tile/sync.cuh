// Barriers among a subset of a CTA's threads.
#pragma once

namespace tessera::tile {

// Named barrier `id` (1..15; 0 is __syncthreads') among `threads` threads, whole warps: groups
// of a CTA that meet at their own barrier never wait for each other.
__device__ __forceinline__ void group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrives at named barrier `id` without waiting: with group_sync, one group signals another (the
// `threads` count both groups' threads).
__device__ __forceinline__ void group_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace tessera::tile
