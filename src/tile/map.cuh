// Elementwise maps: out[i] = f(in0[i], ...) with all arithmetic in float32; or, for a functor
// returning Floats<NOUT>, NOUT outputs from one pass over the inputs (a backward's gradients).
//
// map_contiguous is the fast path for dense tensors: each thread moves UNROLL 16-byte vectors
// per input, all loads issued before the first use so that enough bytes are in flight to cover
// HBM latency; the last partial vector of the tensor goes through the masked helpers, apart.
// map_strided is the general path (any strides, broadcast inputs with stride 0).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tile/convert.cuh"
#include "tile/indexing.cuh"
#include "tile/vec.cuh"

namespace tessera::tile {

inline constexpr int kMapThreads = 256;

template <class T, int NIN>
struct Inputs {
  const T* p[NIN];
};
template <class T, int NOUT>
struct Outputs {
  T* p[NOUT];
};

// What a functor of several outputs returns; a float is one output.
template <int N>
struct Floats {
  float v[N];
};
__device__ __forceinline__ Floats<1> as_floats(float x) { return {{x}}; }
template <int N>
__device__ __forceinline__ Floats<N> as_floats(const Floats<N>& x) { return x; }

template <int NIN, class T, int V, class F>
__device__ __forceinline__ auto apply(const F& f, const Vec<T, V> (&x)[NIN], int e) {
  if constexpr (NIN == 1) return as_floats(f(to_float(x[0][e])));
  else if constexpr (NIN == 2) return as_floats(f(to_float(x[0][e]), to_float(x[1][e])));
  else return as_floats(f(to_float(x[0][e]), to_float(x[1][e]), to_float(x[2][e])));
}

// f over one vector of each input: the vector of each output.
template <int NIN, int NOUT, class T, int V, class F>
__device__ __forceinline__ void map_vector(const F& f, const Vec<T, V> (&x)[NIN], Vec<T, V> (&r)[NOUT]) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const Floats<NOUT> y = apply<NIN>(f, x, e);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) r[k][e] = from_float<T>(y.v[k]);
  }
}

// Whole vectors only in the main path: a predicated 16-byte access each, no per-vector masked
// branch (which costs the dense case about a tenth of its rate); the n % V elements after the
// last whole vector go to the one thread whose vector index is n / V.
template <int V, int UNROLL, int NIN, int NOUT, class T, class F>
__global__ __launch_bounds__(kMapThreads) void map_contiguous_kernel(int64_t n, Outputs<T, NOUT> out,
                                                                      Inputs<T, NIN> in, F f) {
  const int64_t nv = n / V, first = static_cast<int64_t>(blockIdx.x) * (kMapThreads * UNROLL);
  Vec<T, V> x[UNROLL][NIN];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t i = first + u * kMapThreads + threadIdx.x;
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[u][k] = i < nv ? load<V>(in.p[k] + i * V) : Vec<T, V>{};
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int64_t i = first + u * kMapThreads + threadIdx.x;
    if (i >= nv) continue;
    Vec<T, V> r[NOUT];
    map_vector<NIN>(f, x[u], r);
#pragma unroll
    for (int k = 0; k < NOUT; ++k) store<V>(out.p[k] + i * V, r[k]);
  }
  if constexpr (V > 1) {
    const int64_t rel = nv - first;
    if (n % V != 0 && rel >= 0 && rel < kMapThreads * UNROLL && rel % kMapThreads == threadIdx.x) {
      const int valid = static_cast<int>(n - nv * V);
      Vec<T, V> t[NIN], r[NOUT];
#pragma unroll
      for (int k = 0; k < NIN; ++k) t[k] = load_masked<V>(in.p[k] + nv * V, valid, T{});
      map_vector<NIN>(f, t, r);
#pragma unroll
      for (int k = 0; k < NOUT; ++k) store_masked<V>(out.p[k] + nv * V, r[k], valid);
    }
  }
}

template <int V, int UNROLL, int NIN, int NOUT, class T, class F>
void launch_map_contiguous_v(int64_t n, Outputs<T, NOUT> out, Inputs<T, NIN> in, F f, cudaStream_t stream) {
  constexpr int64_t per_block = int64_t(kMapThreads) * UNROLL * V;
  const auto grid = static_cast<unsigned>((n + per_block - 1) / per_block);
  map_contiguous_kernel<V, UNROLL, NIN><<<grid, kMapThreads, 0, stream>>>(n, out, in, f);
}

// The contiguous map's configuration: the vector width (16 bytes when every pointer allows it)
// and the unroll (4 vectors per thread on large tensors; 1 on small ones, where more blocks beat
// more bytes per thread).
struct MapConfig {
  bool vec;    // 16-byte vectors (else one element per access)
  int unroll;  // vectors per thread
};

template <int NIN, class T, int NOUT = 1>
MapConfig map_config(int64_t n, const Outputs<T, NOUT>& out, const Inputs<T, NIN>& in, int sm_count) {
  constexpr int V = kVec16<T>;
  bool aligned = true;
  for (int k = 0; k < NOUT; ++k) aligned = aligned && is_aligned<T, V>(out.p[k]);
  for (int k = 0; k < NIN; ++k) aligned = aligned && is_aligned<T, V>(in.p[k]);
  if (!aligned) return {false, 4};
  return {true, n >= int64_t(kMapThreads) * 4 * V * 4 * sm_count ? 4 : 1};
}

template <int NIN, class T>
MapConfig map_config(int64_t n, const T* out, const Inputs<T, NIN>& in, int sm_count) {
  return map_config<NIN>(n, Outputs<T, 1>{{const_cast<T*>(out)}}, in, sm_count);
}

template <int NIN, class T, int NOUT, class F>
void launch_map_contiguous(int64_t n, Outputs<T, NOUT> out, Inputs<T, NIN> in, F f, const MapConfig& c,
                           cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  if (!c.vec) launch_map_contiguous_v<1, 4, NIN>(n, out, in, f, stream);
  else if (c.unroll == 4) launch_map_contiguous_v<V, 4, NIN>(n, out, in, f, stream);
  else launch_map_contiguous_v<V, 1, NIN>(n, out, in, f, stream);
}

template <int NIN, class T, class F>
void launch_map_contiguous(int64_t n, T* out, Inputs<T, NIN> in, F f, const MapConfig& c, cudaStream_t stream) {
  launch_map_contiguous<NIN>(n, Outputs<T, 1>{{out}}, in, f, c, stream);
}

template <int NIN, class T, class F>
void launch_map_contiguous(int64_t n, T* out, Inputs<T, NIN> in, F f, int sm_count, cudaStream_t stream) {
  launch_map_contiguous<NIN>(n, out, in, f, map_config<NIN>(n, out, in, sm_count), stream);
}

// General layout: idx holds output k's strides in slot k and input k's in slot NOUT + k.
template <int NIN, int NOUT, class T, class F>
__global__ __launch_bounds__(kMapThreads) void map_strided_kernel(int64_t n, Outputs<T, NOUT> out, Inputs<T, NIN> in,
                                                                   StridedIndexer<NIN + NOUT> idx, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[NIN + NOUT];
    idx.offsets(i, off);
    const int64_t* at = off + NOUT;
    Floats<NOUT> r;
    if constexpr (NIN == 1) r = as_floats(f(to_float(in.p[0][at[0]])));
    else if constexpr (NIN == 2) r = as_floats(f(to_float(in.p[0][at[0]]), to_float(in.p[1][at[1]])));
    else r = as_floats(f(to_float(in.p[0][at[0]]), to_float(in.p[1][at[1]]), to_float(in.p[2][at[2]])));
#pragma unroll
    for (int k = 0; k < NOUT; ++k) out.p[k][off[k]] = from_float<T>(r.v[k]);
  }
}

// Strided, but with every tensor's last dimension contiguous (a view of whole rows, or of blocks of
// them, such as swiglu's gate and up): idx is over 16-byte vectors (the last dimension counted in
// vectors), one index computation per vector instead of per element.
template <int V, int NIN, int NOUT, class T, class F>
__global__ __launch_bounds__(kMapThreads) void map_rows_kernel(int64_t nvec, Outputs<T, NOUT> out, Inputs<T, NIN> in,
                                                                StridedIndexer<NIN + NOUT> idx, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < nvec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[NIN + NOUT];
    idx.offsets(i, off);
    Vec<T, V> x[NIN], r[NOUT];
#pragma unroll
    for (int k = 0; k < NIN; ++k) x[k] = load<V>(in.p[k] + off[NOUT + k]);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const Floats<NOUT> y = apply<NIN>(f, x, e);
#pragma unroll
      for (int k = 0; k < NOUT; ++k) r[k][e] = from_float<T>(y.v[k]);
    }
#pragma unroll
    for (int k = 0; k < NOUT; ++k) store<V>(out.p[k] + off[k], r[k]);
  }
}

inline unsigned map_strided_grid(int64_t n, int sm_count) {
  const long long blocks = (n + kMapThreads - 1) / kMapThreads;
  return static_cast<unsigned>(blocks < 32LL * sm_count ? blocks : 32LL * sm_count);
}

template <int NIN, class T, int NOUT, class F>
void launch_map_strided(int64_t n, Outputs<T, NOUT> out, Inputs<T, NIN> in, const StridedIndexer<NIN + NOUT>& idx,
                        F f, int sm_count, cudaStream_t stream) {
  map_strided_kernel<NIN, NOUT><<<map_strided_grid(n, sm_count), kMapThreads, 0, stream>>>(n, out, in, idx, f);
}

template <int NIN, class T, int NOUT, class F>
void launch_map_rows(int64_t nvec, Outputs<T, NOUT> out, Inputs<T, NIN> in, const StridedIndexer<NIN + NOUT>& idx,
                     F f, int sm_count, cudaStream_t stream) {
  map_rows_kernel<kVec16<T>, NIN, NOUT><<<map_strided_grid(nvec, sm_count), kMapThreads, 0, stream>>>(
      nvec, out, in, idx, f);
}

template <int NIN, class T, class F>
void launch_map_strided(int64_t n, T* out, Inputs<T, NIN> in, const StridedIndexer<NIN + 1>& idx,
                        F f, int sm_count, cudaStream_t stream) {
  launch_map_strided<NIN>(n, Outputs<T, 1>{{out}}, in, idx, f, sm_count, stream);
}

}  // namespace tessera::tile
