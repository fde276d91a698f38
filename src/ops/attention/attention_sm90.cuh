// What the Hopper attention kernels (forward and backward) share: the copy engine's view of a
// [batch, seq, heads, head_dim] tensor, the accumulator layout's rows and packing, and the
// staged store of a warpgroup's 64-row tile.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/attention/attention.cuh"
#include "runtime/device.hpp"
#include "runtime/tma.hpp"
#include "tile/constants.cuh"
#include "tile/reduce.cuh"
#include "tile/sync.cuh"

namespace tessera::attn::sm90 {

using tile::kLog2e, tile::kLn2;

// A [batch, seq, heads, head_dim] tensor as the copy engine's 4-d map (head_dim innermost),
// boxes of 64 x `rows`. A dimension of size 1 gets a packed stride: its stride is never stepped
// and may be anything, including what the copy engine refuses.
inline runtime::TmaShape shape_of(const Strides& st, int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                                  int rows) {
  runtime::TmaShape sh;
  sh.rank = 4;
  const int64_t dims[4] = {dim, seq, heads, batch}, stride[4] = {1, st.s, st.h, st.b};
  for (int i = 0; i < 4; ++i) {
    sh.dims[i] = uint64_t(dims[i]);
    sh.strides[i] = i > 0 && dims[i] == 1 ? sh.strides[i - 1] * sh.dims[i - 1] : uint64_t(stride[i]);
  }
  sh.box[0] = 64, sh.box[1] = uint32_t(rows);
  return sh;
}

// A CTA's place in a grid of (tile, head, sequence). Blocks are dispatched about in linear order,
// x fastest; this takes the (head, sequence) pairs `band` at a time and, within a band, sends each
// pair's first tile before any pair's second. Where the first tiles are the heaviest (under a causal
// mask), that is longest-first scheduling within the band: light tiles fill the waves' ends instead
// of heavy ones running alone in the last. A band of about two waves of CTAs (band_of) keeps the
// heads that run at the same time few, so their K and V (forward) or Q and dO (backward) stay in L2.
struct GridPos {
  int x, y, z;
};
__device__ __forceinline__ GridPos tile_slowest(int band) {
  const uint64_t pairs = uint64_t(gridDim.y) * gridDim.z, per_band = uint64_t(band) * gridDim.x;
  const uint64_t linear = blockIdx.x + uint64_t(gridDim.x) * (blockIdx.y + uint64_t(gridDim.y) * blockIdx.z);
  const uint64_t first = linear / per_band * band;       // the band's first pair
  const uint64_t n = min(uint64_t(band), pairs - first);  // the band's pairs (the last band: fewer)
  const uint64_t r = linear % per_band, pair = first + r % n;
  return {int(r / n), int(pair % gridDim.y), int(pair / gridDim.y)};
}
inline int band_of(const dim3& grid, int device) {
  return std::max(1, 2 * runtime::device_props(device).multiProcessorCount / int(grid.x));
}

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The accumulator layout (tile/wgmma.cuh): d[j] is row g + 8 ((j / 2) % 2) of the thread's quad
// (g = lane / 4), column 8 (j / 4) + 2 (lane % 4) + j % 2. A row's values are spread over a quad.
__device__ __forceinline__ int row_of(int j) { return (j / 2) % 2; }
__device__ __forceinline__ int col_of(int j, int lane) { return 8 * (j / 4) + 2 * (lane % 4) + j % 2; }

// ALiBi's bias -slope |c - d[r]| over an accumulator tile whose thread rows r have the reference
// d[r] (a query's diagonal key, or a key's diagonal query) and whose columns c start at c0: the
// thread's part of c - d[r], c0 + 2 (lane % 4) - d[r] (one conversion a row and tile), plus the
// column's constant part 8 (j / 4) + j % 2 (col_of), so that a score costs an add and a
// multiply-add. In float: exact below 2^24, and rounded far below the score beyond.
struct TileBias {
  float slope, off[2];
  __device__ __forceinline__ float at(int j) const {
    return -slope * fabsf(off[row_of(j)] + float(8 * (j / 4) + j % 2));
  }
};
__device__ __forceinline__ TileBias tile_bias(float slope, int c0, const int (&d)[2], int lane) {
  return {slope, {float(c0 + 2 * (lane % 4) - d[0]), float(c0 + 2 * (lane % 4) - d[1])}};
}

// A reduction over a row's quad (every lane of it gets the result), neighbouring lanes first.
template <class Op>
__device__ __forceinline__ float quad_reduce(float v, Op op) {
  return tile::warp_reduce<4, tile::Butterfly::near_first>(v, op);
}

// An accumulator tile 64 x N as the A operand of a register-sourced multiply, 16 columns a step.
template <class T, int N>
__device__ __forceinline__ void pack_a(const float (&d)[N / 2], uint32_t (&a)[N / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = pack2<T>(d[8 * kk + 2 * r], d[8 * kk + 2 * r + 1]);
}

// Stores a warpgroup's 64 x D float32 accumulator tile, row r times mul[r's half], as T: staged
// through rows row0 .. row0 + 63 of `buf` (a [D / 64][buf_rows][64] tile in the copy engine's
// 128-byte swizzle, so a quad's writes and the row reads spread over the banks), then after a
// barrier among the warpgroup (named barrier `bar`) copied 16 bytes a thread to `out` (row r at
// out + r * stride, a row's bytes contiguous), rows below `valid` only.
template <class T, int D>
__device__ void store_tile(T* buf, int buf_rows, int row0, const float (&acc)[D / 2], const float (&mul)[2],
                           T* out, int64_t stride, int64_t valid, int bar) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int j = 0; j < D / 2; j += 2) {
    const int col = col_of(j, lane), row = row0 + warp * 16 + lane / 4 + 8 * row_of(j);
    const int u = (col % 64) / 8;
    *reinterpret_cast<uint32_t*>(&buf[(col / 64) * buf_rows * 64 + row * 64 + ((u ^ (row % 8)) * 8) + col % 8]) =
        pack2<T>(acc[j] * mul[row_of(j)], acc[j + 1] * mul[row_of(j)]);
  }
  tile::group_sync(bar, 128);
  constexpr int kUnits = D / 8;  // 16-byte units per row
#pragma unroll 4
  for (int idx = tid; idx < 64 * kUnits; idx += 128) {
    const int row = idx / kUnits, u = idx % kUnits, uu = u % 8, r = row0 + row;
    if (row >= valid) break;
    *reinterpret_cast<uint4*>(out + row * stride + 8 * u) =
        *reinterpret_cast<const uint4*>(&buf[(u / 8) * buf_rows * 64 + r * 64 + (uu ^ (r % 8)) * 8]);
  }
}

}  // namespace tessera::attn::sm90
