// The Hopper GEMM's epilogue staging: a consumer warpgroup's values of one 128-byte column block of
// its tile (64 16-bit or 32 float32 output columns) written into a staging buffer in the 128-byte
// swizzle, which one thread then stores by TMA (store_tma in gemm_sm90.cuh, store_block in
// gemm_sm90_swiglu.cuh). The writes are what the epilogue costs the tensor cores in the
// cooperative schedule, where both consumers stop multiplying for it: few instructions per value.
#pragma once

#include <cstdint>

#include "tile/async_copy.cuh"
#include "tile/convert.cuh"
#include "tile/frag.cuh"
#include "tile/mma.cuh"
#include "tile/smem.cuh"

namespace tessera::matrix::sm90 {

// A warp holds 16 rows of each 64-row fragment of its consumer's tile, and stores them itself: its
// box of fragment f lies warp_box(w, f) bytes into a staging buffer of 128-byte rows.
constexpr int kWarpRows = 16;
__host__ __device__ constexpr int warp_box(int warp, int f) { return (64 * f + kWarpRows * warp) * 128; }

// Thread t (warp w = t / 32, lane l = t % 32) gives, per fragment f, the pair of columns
// 8 i + 2 (l % 4) and + 1 of row 64 f + 16 w + l / 4 + 8 r as value(f, 4 i + 2 r): wgmma's
// accumulator layout, i over the block's 8-column groups. With Beta and `beta` set, beta times the value the
// buffer already holds there (the old output, loaded by TMA) is added before rounding.
//
// 16-bit outputs go by stmatrix: one call writes four 8 x 8 blocks (groups i and i + 1, rows + 0
// and + 8), which are the thread's values 4 i to 4 i + 7 in order; ldmatrix reads the old values
// in the same layout. Lane l gives the address of row l % 8 of block l / 8: row 8 (l / 8 % 2) +
// l % 8 of the warp's 16, group i + l / 16. The swizzle XORs a row's 16-byte chunk index with the
// row's low three bits (l % 8); i is even, so the chunk is i ^ (l / 16 ^ l % 8), worked out once.
template <class OutT, int Frags, bool Beta, class Value>
__device__ __forceinline__ void stage_block(unsigned char* buf, float beta, Value value) {
  constexpr int kGroups = 16 / int(sizeof(OutT));  // 8-column groups in 128 bytes
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  if constexpr (sizeof(OutT) == 2) {
    const int q = lane / 8, k = lane % 8;
    const uint32_t row_addr = tile::smem_addr(buf) + uint32_t(16 * warp + 8 * (q % 2) + k) * 128;
    const uint32_t chunk = uint32_t((q / 2) ^ k) * 16;
#pragma unroll
    for (int f = 0; f < Frags; ++f)
#pragma unroll
      for (int i = 0; i < kGroups; i += 2) {
        const uint32_t addr = row_addr + 64 * 128 * f + ((16 * i) ^ chunk);
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
          const float2 x = value(f, 4 * i + e);
          v[e] = x.x, v[e + 1] = x.y;
        }
        if (Beta && beta != 0.0f) {
          tile::Frag<OutT, 8> old;
          tile::ldmatrix_x4<false>(old.w, addr);
#pragma unroll
          for (int e = 0; e < 8; ++e) v[e] += beta * old[e];
        }
        tile::stmatrix_x4(addr, tile::pack<OutT, 8>(v).w);
      }
  } else {
    struct alignas(2 * sizeof(OutT)) Pair {
      OutT x, y;
    };
#pragma unroll
    for (int i = 0; i < kGroups; ++i)
#pragma unroll
      for (int f = 0; f < Frags; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = 64 * f + 16 * warp + lane / 4 + 8 * r, col = 8 * i + 2 * (lane % 4);
          Pair* at = reinterpret_cast<Pair*>(buf + tile::sw128_offset(row, col * sizeof(OutT)));
          float2 v = value(f, 4 * i + 2 * r);
          if (Beta && beta != 0.0f) {
            const Pair o = *at;
            v.x += beta * tile::to_float(o.x), v.y += beta * tile::to_float(o.y);
          }
          *at = Pair{tile::from_float<OutT>(v.x), tile::from_float<OutT>(v.y)};
        }
  }
}

}  // namespace tessera::matrix::sm90
