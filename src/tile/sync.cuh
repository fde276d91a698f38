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

// Counters in global memory by which CTAs that run at the same time meet: each adds itself once
// its writes are done (release: a thread's __threadfence() and a block barrier before make the
// block's writes visible first), and one thread waits until all have (acquire), then a block
// barrier passes the news on. Waiting is safe only for CTAs that are all resident at once.
__device__ __forceinline__ void count_in(int* counter) { atomicAdd(counter, 1); }

// Counts a CTA out of the `arrive` counter that count_in and wait_count used, on `depart`: the
// last of `target` to leave sets both back to zero (every CTA has passed its wait by then), so a
// counter pair can be reused by the next launch without a memset (runtime::zeroed_counters).
__device__ __forceinline__ void count_out(int* arrive, int* depart, int target) {
  if (atomicAdd(depart, 1) == target - 1) atomicExch(arrive, 0), atomicExch(depart, 0);
}

// One of `n` CTAs that each leave partial results for the last to combine: publishes this CTA's
// writes, counts it on `counter`, and returns true in every thread of the last CTA to arrive
// (false in the others), which sets the counter back to zero for the next launch and, fenced
// again, may read the others' writes. Every thread of the CTA calls it.
__device__ __forceinline__ bool last_to_arrive(unsigned* counter, unsigned n) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == n - 1;
    if (last) *counter = 0;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

__device__ __forceinline__ void wait_count(const int* counter, int target) {
  int v;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
  } while (v < target);
}

}  // namespace tessera::tile
