// Bulk copies from global into shared memory (sm_90's cp.async.bulk: the copy engine behind TMA,
// for contiguous bytes, no tensor map) and the transaction barriers that say when they landed.
//
// Why: a kernel that holds the rows it works on in registers has as many bytes in flight as its
// registers can hold, and nothing in flight while it computes. Staging rows in a ring of
// shared-memory slots instead lets one thread keep the next rows' copies in flight while the
// others compute on the current one, so the bytes in flight per SM are set by shared memory
// (~200 KB), not registers.
//
// A slot's barrier completes one phase per fill: the issuing thread announces the bytes
// (expect), issues the copies, and every reader waits for the phase's parity (u & 1 on the
// slot's u-th fill). Sources and destinations must be 16-byte aligned and sizes multiples of 16.
// sm_90 only: on older GPUs these trap (launchers never select such kernels there).
#pragma once

#include <cuda/ptx>

#include <cstdint>

namespace tessera::tile {

struct BulkBarrier {
  uint64_t* bar;  // in shared memory

  // Once, by one thread; then bulk_barriers_ready() and a block barrier before any use. A phase
  // completes once `arrivals` threads have arrived (expect() counts as one) and the announced
  // bytes have landed.
  __device__ __forceinline__ void init(uint32_t arrivals = 1) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cuda::ptx::mbarrier_init(bar, arrivals);
#else
    __trap();
#endif
  }
  // By the issuing thread, before its copies: this phase completes once `bytes` have landed.
  __device__ __forceinline__ void expect(uint32_t bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         bar, bytes);
#else
    __trap();
#endif
  }
  // Copies `bytes` from global `src` to shared `dst`, counted against this barrier.
  __device__ __forceinline__ void copy(void* dst, const void* src, uint32_t bytes) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    cuda::ptx::cp_async_bulk(cuda::ptx::space_shared, cuda::ptx::space_global, dst, src, bytes, bar);
#else
    __trap();
#endif
  }
  // One arrival without bytes: a consumer saying it is done with what the phase brought.
  __device__ __forceinline__ void arrive() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    (void)cuda::ptx::mbarrier_arrive(bar);
#else
    __trap();
#endif
  }
  // Returns once the phase of the given parity has completed (its bytes are visible).
  __device__ __forceinline__ void wait(uint32_t parity) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    while (!cuda::ptx::mbarrier_try_wait_parity(bar, parity)) {
    }
#else
    __trap();
#endif
  }
};

// After init() of a CTA's barriers: makes them visible to the copy engine.
__device__ __forceinline__ void bulk_barriers_ready() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
#else
  __trap();
#endif
}

// The other direction: a CTA's float32 partial sums, staged in shared memory, added into global
// memory by the copy engine (cp.reduce.async.bulk), so that many CTAs accumulate into one buffer
// without a thread issuing an atomic per value. The order of the additions is not fixed.
//
// Use: the threads write the staging buffer, fence_async_shared(), a barrier among them; then one
// thread issues bulk_reduce_add() and bulk_commit(); before the buffer is written again, that
// thread waits with bulk_wait_read<0>() (the copy engine has read it) and a barrier follows.
__device__ __forceinline__ void bulk_reduce_add(float* dst, const float* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::cp_reduce_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, cuda::ptx::op_add, dst, src,
                                  bytes);
#else
  __trap();
#endif
}

__device__ __forceinline__ void bulk_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::cp_async_bulk_commit_group();
#else
  __trap();
#endif
}

// Returns once at most `Pending` committed groups still read their shared-memory sources.
template <int Pending>
__device__ __forceinline__ void bulk_wait_read() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<Pending>{});
#else
  __trap();
#endif
}

// Returns once at most `Pending` committed groups are still in progress: the others' writes to
// global memory are done (after which a release, e.g. fence_async_global() and an atomic, may
// publish them).
template <int Pending>
__device__ __forceinline__ void bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<Pending>{});
#else
  __trap();
#endif
}

// Orders this thread's global-memory accesses through the copy engine (the async proxy) with its
// ordinary ones, both ways.
__device__ __forceinline__ void fence_async_global() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::fence_proxy_async(cuda::ptx::space_global);
#else
  __trap();
#endif
}

// Makes this thread's ordinary writes to shared memory visible to the copy engine and to wgmma
// (the async proxy), which read shared memory on their own path.
__device__ __forceinline__ void fence_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cuda::ptx::fence_proxy_async(cuda::ptx::space_shared);
#else
  __trap();
#endif
}

// Asks the copy engine to bring `bytes` of global memory from `src` into L2, for a read that comes
// later. Nothing waits on it and it changes no data: a hint. 16-byte aligned, a multiple of 16.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
#else
  __trap();
#endif
}

}  // namespace tessera::tile
