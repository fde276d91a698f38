// The gated activations swiglu and geglu in the Hopper GEMM's epilogue: consume (gemm_sm90.cuh)
// calls store_swiglu in place of store_tma. With z = alpha * acc + bias over the product's N
// columns, the output has N / 2: out[:, 64 j + c] = act(z[:, 128 j + c]) * z[:, 128 j + 64 + c]
// (tessera::swiglu's layout), act silu or tanh-GELU, and the product itself is stored only where
// the pre-activation output asks for it.
//
// A tile's BN columns (256 or 128) are whole 128-column blocks, each 64 gate columns then their 64
// up columns. In wgmma's accumulator layout a thread holds columns 8 i + 2 (l % 4) and the next in
// acc[4 i + 2 r] and acc[4 i + 2 r + 1] (rows l / 4 + 8 r of its warp's 16), so column c + 64 is
// the same thread's acc index + 32: each gate meets its up in registers, with no exchange between
// threads. The host side (Sm90Tier) takes it for 16-bit outputs that TMA can store, K-major
// operands (the kernels that hold this code: kSwigluKernel), N a multiple of 128, no residual or
// beta, and whole tiles only (no split-K chunks).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "ops/matrix/gemm_sm90_stage.cuh"
#include "tile/activation.cuh"
#include "tile/bulk.cuh"
#include "tile/convert.cuh"
#include "tile/smem.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"

namespace tessera::matrix::sm90 {

// The kernels that hold store_swiglu: 16-bit output of the inputs' dtype, both operands K-major (x @
// W^T, a linear layer's layout). Each copy adds about a fifth to its kernel's code, so the other
// layouts run swiglu as the product, then tessera::swiglu.
template <class T, class OutT, bool KA, bool KB>
constexpr bool kSwigluKernel = sizeof(T) == 2 && std::is_same_v<T, OutT> && KA && KB;

// One 128-byte column block (64 16-bit columns) of a consumer's Rows rows: value(f, j) is the
// thread's pair of columns 8 i + 2 (l % 4) and + 1 in row 64 f + 16 w + l / 4 + 8 r, j = 4 i + 2 r,
// written into staging buffer `flip` in the 128-byte swizzle, then TMA-stored at (x, y) of `map`,
// each warp its own rows (warp_box). The two buffers alternate, so a warp's store waits only for
// its one before the previous (as store_tma's without a pre-activation), and the last ones drain
// under the next tile's main loop.
template <int Rows, class OutT, int Frags, class Value>
__device__ __forceinline__ void store_block(unsigned char* out, const CUtensorMap* map, bool batched,
                                            int x, int y, int batch, int& flip, Value value) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  unsigned char* buf = out + flip * Rows * 128;
  flip ^= 1;
  if (lane == 0) tile::bulk_wait_read<1>();
  __syncwarp();
  stage_block<OutT, Frags, false>(buf, 0.0f, value);
  tile::fence_async_shared();
  __syncwarp();
  if (lane == 0) {
#pragma unroll
    for (int f = 0; f < Frags; ++f) {
      const int row = y + 64 * f + kWarpRows * warp;
      if (batched) tile::tma_store(map, x, row, batch, buf + warp_box(warp, f));
      else tile::tma_store(map, x, row, buf + warp_box(warp, f));
    }
    tile::bulk_commit();
  }
}

// The consumer's tile (rows from `row0`, product columns from `col0`) of a whole unit: per
// 128-column block, z in place in the accumulators (the next tile's first wgmma overwrites them),
// then the pre-activation's gate and up blocks to maps[1] at columns col0 + 128 q (+ 64) where
// asked for, and the output's block to maps[0] at col0 / 2 + 64 q. `out`, `flip`: the consumer's
// staging buffers and the next one to use, shared with store_tma; `maps`: OutMaps {c, z}.
template <int Rows, int BN, class OutT, int Frags, int Acc>
__device__ __forceinline__ void store_swiglu(unsigned char* out, const CUtensorMap* maps, bool batched,
                                             const Epilogue<OutT>& epi, float alpha,
                                             float (&acc)[Frags][Acc], int64_t batch, int64_t row0,
                                             int64_t col0, int64_t n, int& flip) {
  static_assert(sizeof(OutT) == 2 && BN % 128 == 0 && Acc == BN / 2, "16-bit blocks of 64 columns");
  const int lane = threadIdx.x % 32;
  const tile::Silu<true> silu;
  const tile::GeluTanh<true> gelu;
  const bool geglu = epi.activation == Activation::geglu;  // one kernel for both: a uniform branch
#pragma unroll
  for (int q = 0; q < BN / 128; ++q) {
    if (col0 + 128 * q >= n) break;  // N is whole blocks: the tile's rest lies beyond it
    const int j0 = 64 * q;           // the block's gate accumulators; its up ones at + 32
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const auto cols = epi.cols(col0 + 128 * q + 8 * i + 2 * (lane % 4), true);
#pragma unroll
      for (int f = 0; f < Frags; ++f)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float* a = &acc[f][j0 + 4 * i + 2 * r];
          a[0] = alpha * a[0] + cols.bias0, a[1] = alpha * a[1] + cols.bias1;
        }
    }
    const int x = int(col0) + 128 * q, y = int(row0), b = int(batch);
    if (epi.z) {
      store_block<Rows, OutT, Frags>(out, maps + 1, batched, x, y, b, flip, [&](int f, int j) {
        return make_float2(acc[f][j0 + j], acc[f][j0 + j + 1]);
      });
      store_block<Rows, OutT, Frags>(out, maps + 1, batched, x + 64, y, b, flip, [&](int f, int j) {
        return make_float2(acc[f][j0 + j + 32], acc[f][j0 + j + 33]);
      });
    }
    store_block<Rows, OutT, Frags>(out, maps, batched, x / 2, y, b, flip, [&](int f, int j) {
      const float* g = &acc[f][j0 + j];
      return geglu ? make_float2(gelu(g[0]) * g[32], gelu(g[1]) * g[33])
                   : make_float2(silu(g[0]) * g[32], silu(g[1]) * g[33]);
    });
  }
}

}  // namespace tessera::matrix::sm90
