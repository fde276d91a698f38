// Row tiles: one row of a row-wise operator (softmax, a norm) held in registers by a group of
// threads, and the reductions over that group.
//
// A group is one warp (several short rows per CTA, no block barrier), a whole CTA, or a cluster of
// C CTAs on sm_90 (a row too long for one SM's registers is split over C SMs, which exchange their
// partial results through distributed shared memory, so the row is still read from HBM once).
//
// Layout within a row: the group's `base` is the first column of its chunk (rank * chunk for a
// cluster, 0 otherwise); thread t of G holds VPT vectors of V elements, vector k at columns
// [base + (k * G + t) * V, ... + V). For a fixed k the group reads G * V consecutive elements:
// coalesced, 16 bytes per thread when V = 16 / sizeof(T).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "tile/convert.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace tessera::tile {

template <int V>
struct RowPartition {
  int64_t base;  // first column of this group's (or this CTA's) chunk
  int t;         // thread index within the group
  int G;         // threads in the group
  __device__ __forceinline__ int64_t col(int k) const {
    return base + (static_cast<int64_t>(k) * G + t) * V;
  }
  // Elements of vector k inside a row of n columns: V, fewer at the ragged end, or 0.
  __device__ __forceinline__ int valid(int k, int64_t n) const {
    const int64_t left = n - col(k);
    return left >= V ? V : left > 0 ? static_cast<int>(left) : 0;
  }
};

// Loads the thread's VPT vectors of a row of n columns; columns past the end read as `fill`.
// `row` must be aligned to V elements (16 bytes for the vector width).
template <int V, int VPT, class T>
__device__ __forceinline__ void load_row(Vec<T, V> (&frag)[VPT], const T* row, int64_t n,
                                         const RowPartition<V>& p, T fill) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) frag[k] = load_tile<V>(row, p.col(k), n, fill);
}

template <int V, int VPT, class T>
__device__ __forceinline__ void store_row(T* row, int64_t n, const RowPartition<V>& p,
                                          const Vec<T, V> (&frag)[VPT]) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) store_tile<V>(row, p.col(k), n, frag[k]);
}

// ---- online softmax ---------------------------------------------------------------------------
// (m, s): the maximum of a set of values and the sum of exp(x - m) over it. Two states merge
// exactly, in any grouping, so partial results from lanes, warps, CTAs or row chunks combine into
// the row's (max, sum) in one reduction instead of two (max first, then sum).
struct SoftmaxState {
  float m;
  float s;
};

inline constexpr float kLog2e = 1.4426950408889634f;

// exp(x) on the MUFU (ex2.approx, ~2 ulp): every softmax kernel's one transcendental.
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * kLog2e); }

__device__ __forceinline__ SoftmaxState softmax_empty() { return {-INFINITY, 0.0f}; }

// Adds one value (one exp: the sum is rescaled only when the maximum moves). A NaN value makes s
// NaN, which is how a NaN in a row turns the whole row NaN, as in torch. Kernels that hold a
// whole row take its maximum first and add exp(x - m) directly; this form is for streaming.
__device__ __forceinline__ SoftmaxState softmax_add(SoftmaxState a, float x) {
  if (x > a.m) return {x, fmaf(a.s, fast_exp(a.m - x), 1.0f)};
  if (a.m == -INFINITY) return x == -INFINITY ? a : SoftmaxState{a.m, NAN};  // x is -inf or NaN
  return {a.m, a.s + fast_exp(x - a.m)};
}

struct SoftmaxMerge {
  __device__ __forceinline__ SoftmaxState operator()(SoftmaxState a, SoftmaxState b) const {
    const float m = fmaxf(a.m, b.m);
    // Both maxima -inf: no finite term, but a NaN among -inf values must survive (s is 0 or NaN).
    if (m == -INFINITY) return {m, a.s + b.s};
    return {m, a.s * fast_exp(a.m - m) + b.s * fast_exp(b.m - m)};
  }
};

// ---- group reductions -------------------------------------------------------------------------
// Over a warp (G = 32): every lane gets the result.
template <class T, class Op>
__device__ __forceinline__ T warp_group_reduce(T v, Op op) { return warp_reduce(v, op); }

// Over the CTA: block_reduce (reduce.cuh), with `scratch` of 32 T in shared memory.

// Over all threads of a cluster of CTAs (sm_90). Each CTA reduces its own threads, publishes the
// result in its shared `slot`, and every thread combines the C published values in rank order,
// so all CTAs get the same, deterministic result. `scratch` as for block_reduce; `slot` is one T
// of shared memory not used for anything else while the call runs.
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

}  // namespace tessera::tile
