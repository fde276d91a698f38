// Rows: how a group of threads partitions a row held in registers (Frag, tile/frag.cuh), and the
// per-row accumulators that row-wise operators reduce (sums of pairs, Welford moments; the
// online-softmax state is tile/online_softmax.cuh's). The reductions themselves are in
// tile/reduce.cuh.
//
// Layout within a row: thread t of a group of G holds vectors k = 0, 1, ... at columns
// (k * G + t) * V of the group's chunk: for a fixed k the group reads G * V consecutive elements,
// coalesced, 16 bytes per thread when V = 16 / sizeof(T). Offsets are 32-bit (a chunk held in
// registers has at most 1024 x 16 x 8 elements), cheap enough to recompute at each use instead
// of holding 64-bit addresses per vector in registers.
#pragma once

#include <climits>
#include <cstdint>

#include "tile/frag.cuh"
#include "tile/indexing.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"

namespace tessera::tile {

template <int V>
struct RowLanes {
  int t;  // thread within the group
  int G;  // threads in the group
  int n;  // valid columns of the row (for in / load / store / param)
  __device__ __forceinline__ int col(int k) const { return (k * G + t) * V; }
  // Vector k lies inside the row. Rows whose length is a multiple of V only: a vector is wholly
  // inside or wholly past the end (others use the windowed accesses of frag.cuh).
  __device__ __forceinline__ bool in(int k) const { return col(k) < n; }
  // Vector k of `row`; past the row end every element reads as `fill`.
  template <class T>
  __device__ __forceinline__ Frag<T, V> load(const T* row, int k, float fill) const {
    return in(k) ? load_frag<T, V>(row + col(k)) : splat<T, V>(fill);
  }
  template <class T>
  __device__ __forceinline__ void store(T* row, int k, const Frag<T, V>& v) const {
    if (in(k)) store_frag<T, V>(row + col(k), v);
  }
  // Vector k of an optional per-column parameter (weight, bias): with `vec` null, vector 0 of
  // `dflt` (16 bytes of the default) for every k. Branch-free, so the loads of all k issue
  // together. `after` is 0 (zero_after): the loads cannot be hoisted above the reduction whose
  // result it comes from, where they would hold registers through it.
  template <class T>
  __device__ __forceinline__ Frag<T, V> param(const T* vec, const T* dflt, int k, float fill, int after) const {
    const T* base = vec ? vec : dflt;
    const int c = (vec ? col(k) : 0) + after;
    return in(k) ? load_frag<T, V>(base + c) : splat<T, V>(fill);
  }
};

// The valid columns [lo, hi) of a row, relative to the first column (`base`) of the chunk a group
// works on: 32-bit offsets within a chunk keep the address arithmetic of unrolled accesses short.
struct Window {
  int lo, hi;
};

__device__ __forceinline__ int clamp_col(int64_t c) {
  return static_cast<int>(c < -1 ? -1 : c > INT_MAX ? INT_MAX : c);
}
__device__ __forceinline__ Window window(int64_t base, int64_t lo, int64_t hi) {
  return {clamp_col(lo - base), clamp_col(hi - base)};
}

// Offsets of row `row` in NT tensors whose rows are uniformly strided: one multiply each.
template <int NT>
__device__ __forceinline__ void row_offsets(const int64_t (&stride)[NT], int64_t row, int64_t (&off)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) off[t] = row * stride[t];
}

// Where row r starts in NT tensors of any layout; uniformly strided rows (every dense tensor) take
// one multiply instead of the divisions.
template <int NT>
__device__ __forceinline__ void row_offsets(const StridedIndexer<NT>& idx, int64_t r, int64_t (&off)[NT]) {
  if (idx.ndim == 1) {
#pragma unroll
    for (int t = 0; t < NT; ++t) off[t] = r * idx.strides[t][0];
  } else {
    idx.offsets(r, off);
  }
}

// ---- accumulators -------------------------------------------------------------------------------
// Two sums reduced together (a norm backward's sum(w dy) and sum(w dy xhat)).
struct Pair {
  float a, b;
};
__device__ __forceinline__ Pair operator+(Pair x, Pair y) { return {x.a + y.a, x.b + y.b}; }

// Count, mean and sum of squared deviations from the mean of a set of values, and Chan's merge of
// two such sets (Welford's update generalised to sets): a mean and variance in ONE reduction
// instead of a sum for the mean followed by one of squared deviations from it, with no
// E[x^2] - E[x]^2 cancellation. The merge is symmetric bit for bit (products rounded separately, d
// enters squared), so every lane of a butterfly ends with the same result. {0, 0, 0} is the
// identity.
struct Moments {
  float n, mean, m2;
};
struct MergeMoments {
  __device__ __forceinline__ Moments operator()(Moments a, Moments b) const {
    const float n = a.n + b.n;  // counts are integers < 2^24: exact
    const float inv = n > 0.0f ? __fdividef(1.0f, n) : 0.0f;
    const float d = b.mean - a.mean;
    const float mean = __fadd_rn(__fmul_rn(a.n, a.mean), __fmul_rn(b.n, b.mean)) * inv;
    return {n, mean, fmaf(d, d * (__fmul_rn(a.n, b.n) * inv), a.m2 + b.m2)};
  }
};

}  // namespace tessera::tile
