// Elementwise maps: out[i] = f(in0[i], ...) with all arithmetic in float32.
//
// map_contiguous is the fast path for dense tensors: each thread moves UNROLL 16-byte vectors
// per input, all loads issued before the first use so that enough bytes are in flight to cover
// HBM latency; the last partial vector of the tensor goes through the masked helpers.
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

template <int NIN, class T, int V, class F>
__device__ __forceinline__ float apply(const F& f, const Vec<T, V> (&x)[NIN], int e) {
  if constexpr (NIN == 1) return f(to_float(x[0][e]));
  else if constexpr (NIN == 2) return f(to_float(x[0][e]), to_float(x[1][e]));
  else return f(to_float(x[0][e]), to_float(x[1][e]), to_float(x[2][e]));
}

template <int V, int UNROLL, int NIN, class T, class F>
__global__ __launch_bounds__(kMapThreads) void map_contiguous_kernel(int64_t n, T* __restrict__ out,
                                                                      Inputs<T, NIN> in, F f) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (kMapThreads * UNROLL * V);
  Vec<T, V> x[UNROLL][NIN];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u)
#pragma unroll
    for (int k = 0; k < NIN; ++k)
      x[u][k] = load_tile<V>(in.p[k], base + static_cast<int64_t>(u * kMapThreads + threadIdx.x) * V, n);
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    Vec<T, V> r;
#pragma unroll
    for (int e = 0; e < V; ++e) r[e] = from_float<T>(apply<NIN>(f, x[u], e));
    store_tile<V>(out, base + static_cast<int64_t>(u * kMapThreads + threadIdx.x) * V, n, r);
  }
}

template <int V, int UNROLL, int NIN, class T, class F>
void launch_map_contiguous_v(int64_t n, T* out, Inputs<T, NIN> in, F f, cudaStream_t stream) {
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

template <int NIN, class T>
MapConfig map_config(int64_t n, const T* out, const Inputs<T, NIN>& in, int sm_count) {
  constexpr int V = kVec16<T>;
  bool aligned = is_aligned<T, V>(out);
  for (int k = 0; k < NIN; ++k) aligned = aligned && is_aligned<T, V>(in.p[k]);
  if (!aligned) return {false, 4};
  return {true, n >= int64_t(kMapThreads) * 4 * V * 4 * sm_count ? 4 : 1};
}

template <int NIN, class T, class F>
void launch_map_contiguous(int64_t n, T* out, Inputs<T, NIN> in, F f, const MapConfig& c, cudaStream_t stream) {
  constexpr int V = kVec16<T>;
  if (!c.vec) launch_map_contiguous_v<1, 4, NIN>(n, out, in, f, stream);
  else if (c.unroll == 4) launch_map_contiguous_v<V, 4, NIN>(n, out, in, f, stream);
  else launch_map_contiguous_v<V, 1, NIN>(n, out, in, f, stream);
}

template <int NIN, class T, class F>
void launch_map_contiguous(int64_t n, T* out, Inputs<T, NIN> in, F f, int sm_count, cudaStream_t stream) {
  launch_map_contiguous<NIN>(n, out, in, f, map_config<NIN>(n, out, in, sm_count), stream);
}

// General layout: idx holds out's strides in slot 0 and input k's in slot k + 1.
template <int NIN, class T, class F>
__global__ __launch_bounds__(kMapThreads) void map_strided_kernel(int64_t n, T* out, Inputs<T, NIN> in,
                                                                   StridedIndexer<NIN + 1> idx, F f) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[NIN + 1];
    idx.offsets(i, off);
    float r;
    if constexpr (NIN == 1) r = f(to_float(in.p[0][off[1]]));
    else if constexpr (NIN == 2) r = f(to_float(in.p[0][off[1]]), to_float(in.p[1][off[2]]));
    else r = f(to_float(in.p[0][off[1]]), to_float(in.p[1][off[2]]), to_float(in.p[2][off[3]]));
    out[off[0]] = from_float<T>(r);
  }
}

inline unsigned map_strided_grid(int64_t n, int sm_count) {
  const long long blocks = (n + kMapThreads - 1) / kMapThreads;
  return static_cast<unsigned>(blocks < 32LL * sm_count ? blocks : 32LL * sm_count);
}

template <int NIN, class T, class F>
void launch_map_strided(int64_t n, T* out, Inputs<T, NIN> in, const StridedIndexer<NIN + 1>& idx,
                        F f, int sm_count, cudaStream_t stream) {
  map_strided_kernel<NIN><<<map_strided_grid(n, sm_count), kMapThreads, 0, stream>>>(n, out, in, idx, f);
}

}  // namespace tessera::tile
