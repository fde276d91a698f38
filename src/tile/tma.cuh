// Tensor copies by the copy engine (TMA, sm_90): a box of a tensor map (runtime/tma.hpp) from
// global into shared memory, completing on a BulkBarrier (tile/bulk.cuh) like the contiguous bulk
// copies there. Boxes partly outside the tensor read zeros for the missing elements and still
// count their full size against the barrier. sm_90 only: elsewhere these trap.
#pragma once

#include <cuda.h>
#include <cuda/ptx>

#include <cstdint>

#include "tile/bulk.cuh"

namespace tessera::tile {

// The box at element coordinates (c0 innermost, c1) of `map` into `dst` (aligned as the map's
// swizzle needs: 1024 bytes for the 128-byte swizzle).
__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1,
                                         const BulkBarrier& bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map,
                                  coords, bar.bar);
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                         const BulkBarrier& bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t coords[3] = {c0, c1, c2};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map,
                                  coords, bar.bar);
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load(void* dst, const CUtensorMap* map, int c0, int c1, int c2,
                                         int c3, const BulkBarrier& bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t coords[4] = {c0, c1, c2, c3};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_cluster, cuda::ptx::space_global, dst, map,
                                  coords, bar.bar);
#else
  __trap();
#endif
}

// A copy of `base` with its extent along dimension Dim set to `extent` (the copy engine stores
// nothing at or past it, and loads zeros there), written to `dst` in global memory by the calling
// warp, every lane: built in `tmp` (shared memory, 128-byte aligned), then copied out with the
// release that the copy engine's reads of it need (each user first calls tma_map_acquire).
template <int Dim>
__device__ __forceinline__ void tma_map_with_extent(CUtensorMap* dst, CUtensorMap* tmp, const CUtensorMap& base,
                                                    uint32_t extent) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x % 32;
  static_assert(sizeof(CUtensorMap) == 32 * sizeof(uint32_t), "a word a lane");
  reinterpret_cast<uint32_t*>(tmp)[lane] = reinterpret_cast<const uint32_t*>(&base)[lane];
  __syncwarp();
  const uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(tmp));
  if (lane == 0)
    asm volatile("tensormap.replace.tile.global_dim.shared::cta.b1024.b32 [%0], %1, %2;" ::"r"(at), "n"(Dim),
                 "r"(extent) : "memory");
  __syncwarp();
  asm volatile("tensormap.cp_fenceproxy.global.shared::cta.tensormap::generic.release.gpu.sync.aligned [%0], [%1], 128;"
               ::"l"(dst), "r"(at) : "memory");
#else
  __trap();
#endif
}

// Before a thread's first copy through a map that tma_map_with_extent wrote (in this kernel or an
// earlier one: the copy engine may hold an older map at the same address).
__device__ __forceinline__ void tma_map_acquire(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;" ::"l"(map));
#else
  __trap();
#endif
}

// The other direction: the box at (c0, c1[, c2]) of `map` from `src` in shared memory (written in
// the map's swizzle, then fence_async_shared() by each writer and a barrier among them), by one
// thread, in the bulk group that its next bulk_commit() closes. Elements outside the tensor are
// not written. Before `src` is written again, the issuing thread waits with bulk_wait_read();
// before the CTA exits, with bulk_wait_read<0>().
__device__ __forceinline__ void tma_store(const CUtensorMap* map, int c0, int c1, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t coords[2] = {c0, c1};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords, src);
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_store(const CUtensorMap* map, int c0, int c1, int c2, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int32_t coords[3] = {c0, c1, c2};
  cuda::ptx::cp_async_bulk_tensor(cuda::ptx::space_global, cuda::ptx::space_shared, map, coords, src);
#else
  __trap();
#endif
}

// Brings a map (a __grid_constant__ kernel parameter) into the descriptor cache ahead of its
// first copy.
__device__ __forceinline__ void tma_prefetch(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
#else
  __trap();
#endif
}

}  // namespace tessera::tile
