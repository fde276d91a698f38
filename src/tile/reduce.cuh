// Reductions over aligned groups of a warp's lanes (the whole warp, or the quad or 8 or 16 lanes
// that share a row), a group of warps, a CTA and a cluster of CTAs. Ops are functors, so sums,
// maxima, sums of pairs, the online-softmax merge (tile/online_softmax.cuh) and Welford moments
// (tile/row.cuh) share one shuffle tree. Every form combines in a fixed order: the same bits on
// every run, and on every thread that receives the result. Kernels shuffle through these, never
// by hand.
#pragma once

#include <cooperative_groups.h>

#include <cstring>

#include "tile/sync.cuh"

namespace tessera::tile {

struct Sum {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct Max {
  template <class T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};
// fmaxf as a reduction op: a NaN loses to a number (IEEE maxNum), where Max keeps whichever its
// comparison picks. For kernels whose max must skip NaN as fmaxf does.
struct MaxNum {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// __shfl_xor_sync for any trivially copyable value of whole 32-bit words (a float, or a small
// struct such as the online-softmax state), one shuffle per word.
template <class T>
__device__ __forceinline__ T shuffle_xor(T v, int offset) {
  static_assert(sizeof(T) % 4 == 0, "shuffle_xor moves whole 32-bit words");
  constexpr int kWords = sizeof(T) / 4;
  unsigned w[kWords];
  memcpy(w, &v, sizeof(T));
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = __shfl_xor_sync(0xffffffffu, w[i], offset);
  memcpy(&v, w, sizeof(T));
  return v;
}

// The order in which a butterfly combines lanes: partners Width / 2 apart first, or neighbours
// first. Either is a fixed order (the same bits on every run and every lane); they differ only in
// how sums round, so a kernel keeps the one its results were defined with.
enum class Butterfly { wide_first, near_first };

// Butterfly reduction over each aligned group of Width lanes (a power of two, 1 to 32: lanes
// [g * Width, (g + 1) * Width)), by xor shuffles: every lane ends with its group's result. All 32
// lanes of the warp take part. Width 32 is the whole warp, combined 16, 8, 4, 2, 1 apart.
template <int Width = 32, Butterfly B = Butterfly::wide_first, class T, class Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  static_assert(Width >= 1 && Width <= 32 && (Width & (Width - 1)) == 0, "Width: a power of two up to 32");
  if constexpr (B == Butterfly::wide_first) {
#pragma unroll
    for (int offset = Width / 2; offset > 0; offset >>= 1) v = op(v, shuffle_xor(v, offset));
  } else {
#pragma unroll
    for (int offset = 1; offset < Width; offset <<= 1) v = op(v, shuffle_xor(v, offset));
  }
  return v;
}

template <class T> __device__ __forceinline__ T warp_sum(T v) { return warp_reduce(v, Sum{}); }
template <class T> __device__ __forceinline__ T warp_max(T v) { return warp_reduce(v, Max{}); }

// Block reduction for blockDim.x a multiple of 32 (up to 1024). Every thread gets the result.
// `scratch` is 32 elements of shared memory; the call may be repeated with the same scratch.
template <class T, class Op>
__device__ __forceinline__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  __syncthreads();  // the previous use of scratch is finished
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, op);
}

template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) { return block_reduce(v, Sum{}, T(0), scratch); }

// Reduction over the gs threads of one row group: a warp (shuffles only), or whole warps of a CTA
// that meet at named barrier `bar`, so that the groups of one CTA never wait for each other. Warp
// partials go through slot buffer `buf` (0 or 1) of the group's 2 x 32 `slots` in shared memory.
// A buffer may be written again once every thread has read it: reductions that alternate buffers
// get that from the barrier of the one in between; a reduction that reuses the buffer of the
// previous one passes `fence` for an extra barrier first. A{} must be Op's identity.
template <class A, class Op = Sum>
struct GroupReduce {
  A* slots;
  int gs, bar, warp;
  __device__ __forceinline__ A operator()(A v, int buf, bool fence = false) const {
    v = warp_reduce(v, Op{});
    if (gs == 32) return v;
    if (fence) group_sync(bar, gs);
    A* s = slots + buf * 32;
    const int lane = threadIdx.x & 31;
    if (lane == 0) s[warp] = v;
    group_sync(bar, gs);
    // Up to 8 warp partials: each thread adds them in order from shared memory (broadcast reads,
    // one round of latency), which is shorter than a butterfly; more: a butterfly over them.
    const int nw = gs >> 5;
    if (nw <= 8) {
      A r = s[0];
#pragma unroll
      for (int i = 1; i < 8; ++i)
        if (i < nw) r = Op{}(r, s[i]);
      return r;
    }
    return warp_reduce(lane < nw ? s[lane] : A{}, Op{});
  }
};

// Over all threads of a cluster of CTAs (sm_90). Each CTA reduces its own threads, publishes the
// result in its shared `slot`, and every thread combines the C published values in rank order,
// so all CTAs get the same result. `scratch` as for block_reduce; `slot` is one T of shared
// memory not used for anything else while the call runs.
template <class T, class Op>
__device__ __forceinline__ T cluster_reduce(T v, Op op, T identity, T* scratch, T* slot) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  v = block_reduce(v, op, identity, scratch);
  if (threadIdx.x == 0) *slot = v;
  cluster.sync();  // every CTA's slot is written
  const int lane = threadIdx.x & 31;
  const int ranks = static_cast<int>(cluster.num_blocks());
  T r = identity;
  for (int base = 0; base < ranks; base += 32) {  // clusters have at most 16 CTAs: one round
    T mine = base + lane < ranks ? *cluster.map_shared_rank(slot, base + lane) : identity;
    r = op(r, warp_reduce(mine, op));
  }
  cluster.sync();  // no CTA leaves (freeing its slot) or reuses it while another still reads it
  return r;
#else
  (void)op, (void)identity, (void)scratch, (void)slot;
  __trap();  // launchers use clusters only on sm_90 and newer
  return v;
#endif
}

// This CTA's rank in its cluster (0 without clusters or before sm_90).
__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#else
  return 0;
#endif
}

// The reduction over a row group of kind K, one call for the kernels templated on it.
enum class Scope { warp, block, cluster };

template <Scope K, class U, class Op>
__device__ __forceinline__ U scope_reduce(U v, Op op, U identity, U* scratch, U* slot) {
  if constexpr (K == Scope::warp) return warp_reduce(v, op);
  else if constexpr (K == Scope::block) return block_reduce(v, op, identity, scratch);
  else return cluster_reduce(v, op, identity, scratch, slot);
}

}  // namespace tessera::tile
