// float8_quantize's block granularities in one pass (float8_quantize.cu has the op and its other
// kernels): a CTA per 128 x 128 tile of x, which holds every group it touches whole (a 1 x 128
// block of each of its rows, a 128 x 1 block of each of its columns, or one 128 x 128 block), so
// the tile is read once, into registers, and quantized from there: x read once, q and q_t written
// once, the floor of the op's bytes.
//
// The tile is two Tiles of 128 x 64 side by side (halves), a thread's 4 rows x 8 columns of each,
// all 16 loads in flight before any is used. A row's maximum over the tile's 128 columns: the
// thread's over its 16, shuffled over its row group's 4 lanes (the warp's 32 columns of each
// half), then the two column halves of warps through shared memory. A column's over the tile's 128
// rows: shuffled over its column group's 8 lanes (the warp's 32 rows), then the 4 row quarters
// through shared memory. block2d: the CTA's maximum.
#include "ops/matrix/float8_quantize.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "tile/async_copy.cuh"
#include "tile/reduce.cuh"

namespace tessera::float8 {
namespace {

// One 128 x 128 tile (tr, tc in blocks) from its fragments `v` (two Tiles' of 128 x 64): the
// groups' maxima, multipliers and scales, then the quantized bytes and q_t's tile.
template <class T, int VW>
__device__ __forceinline__ void block_tile(const QuantArgs& a, int64_t col_tiles, int64_t tr, int64_t tc,
                                           const typename Tile<T, VW>::Frags (&v)[2]) {
  using L = Tile<T, VW>;
  __shared__ uint32_t staged[2][kTileCols * kPitch<VW>];  // each half's q_t tile
  __shared__ uint32_t rmax[2][kBlock], cmax[4][kBlock], scratch[32];
  __shared__ float mult[2 * kBlock];  // the tile's rows' multipliers, then its columns'
  const L t[2] = {L(tr * kBlock, tc * kBlock), L(tr * kBlock, tc * kBlock + kTileCols)};
  uint32_t rm[4] = {}, cm[2][8] = {};  // T's magnitude bits: the thread's rows', each half's columns'
#pragma unroll
  for (int h = 0; h < 2; ++h) fold_maxima<T, VW>(v[h], rm, cm[h]);
  const int i = int(threadIdx.x), lane = i % 32, w = i / 32;
  if (a.granularity == Float8Granularity::block2d) {  // whole blocks (M, K multiples of 128)
    const uint32_t all =
        tile::block_reduce(mag_f32<T>(max(max(rm[0], rm[1]), max(rm[2], rm[3]))), tile::Max{}, 0u, scratch);
    mult[i] = multiplier_of(all);  // 256 threads: every row and column the block's
    if (i == 0) {
      if (a.scale) a.scale[tr * col_tiles + tc] = scale_of(mult[0]);
      if (a.scale_t) a.scale_t[tr * col_tiles + tc] = scale_of(mult[0]);
    }
  } else {
    rmax[w % 2][t[0].row + lane % 4] = mag_f32<T>(max_scatter<4, 2>(rm));
#pragma unroll
    for (int h = 0; h < 2; ++h) cmax[w / 2][h * kTileCols + t[h].col_of(lane / 4)] = mag_f32<T>(max_scatter<8, 16>(cm[h]));
    __syncthreads();
    if (i < kBlock) {  // row i's 1 x 128 block
      mult[i] = multiplier_of(max(rmax[0][i], rmax[1][i]));
      if (a.scale && t[0].r0 + i < a.rows) a.scale[(t[0].r0 + i) * col_tiles + tc] = scale_of(mult[i]);
    } else {  // column c's 128 x 1 block
      const int c = i - kBlock;
      mult[i] = multiplier_of(max(max(cmax[0][c], cmax[1][c]), max(cmax[2][c], cmax[3][c])));
      if (a.scale_t && t[0].c0 + c < a.cols) a.scale_t[tr * a.cols + t[0].c0 + c] = scale_of(mult[i]);
    }
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) quantize_tile(a, t[h], v[h], mult, mult + kBlock + h * kTileCols, staged[h]);
  if (!a.qt) return;
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) store_staged(a, t[h], staged[h]);
}

// Element-wise fragments (rows off 16 bytes, K not a multiple of them): a CTA a tile, loaded
// straight into registers (more of them than two CTAs an SM leave: the rare path, without spills).
template <class T, int VW, class Src>
__global__ void __launch_bounds__(kTileThreads, 1) block_kernel(QuantArgs a, int64_t col_tiles) {
  using L = Tile<T, VW>;
  const int64_t tr = blockIdx.x / col_tiles, tc = blockIdx.x % col_tiles;
  typename L::Frags v[2];
  Src::load(a, L(tr * kBlock, tc * kBlock), v[0]);
  Src::load(a, L(tr * kBlock, tc * kBlock + kTileCols), v[1]);
  block_tile<T, VW>(a, col_tiles, tr, tc, v);
}

// 16-byte fragments: persistent CTAs, each taking tiles blockIdx.x, + gridDim.x, ..., with the
// next tile's loads in flight (cp.async into shared memory) while one is quantized, so that an SM
// keeps loads going through the products and stores. A thread stages exactly the
// fragments it reads back (slot-major, consecutive threads 16 bytes apart): no barrier between
// its copies and its reads, and a stage is refilled by the thread that has read it.
template <class T, int VW>
struct Ring {
  static constexpr int kSlots = 2 * 4 * Tile<T, VW>::kF;  // a thread's fragments of a tile
  static constexpr int kStages = 2;                       // a tile in flight while one is quantized
  static constexpr size_t kBytes = size_t(kStages) * kSlots * kTileThreads * 16;  // 64 KB, fp32 128 KB
  static constexpr int kResident = VW == 8 ? 2 : 1;       // CTAs an SM: shared memory's limit
  uint4* ring;

  __device__ uint4* slot(int stage, int s) const { return ring + (stage * kSlots + s) * kTileThreads + threadIdx.x; }
  // Tile `tile`'s fragments into `stage` (zeros outside x), as one group of copies.
  __device__ void issue(const QuantArgs& a, int64_t col_tiles, int64_t tile, int stage) const {
    const int64_t r0 = tile / col_tiles * kBlock, c0 = tile % col_tiles * kBlock;
    const T* x = static_cast<const T*>(a.x);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Tile<T, VW> t(r0, c0 + h * kTileCols);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int f = 0; f < Tile<T, VW>::kF; ++f) {
          const int64_t r = t.r0 + t.row + j, c = t.c0 + t.col + f * 4 * VW;
          const bool in = r < a.rows && c < a.cols;
          tile::cp_async<16>(tile::smem_addr(slot(stage, (h * 4 + j) * Tile<T, VW>::kF + f)), in ? x + r * a.xs + c : x,
                             in ? 16 : 0);
        }
    }
  }
  __device__ void read(int stage, typename Tile<T, VW>::Frags (&v)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int f = 0; f < Tile<T, VW>::kF; ++f)
          v[h][j][f] = *reinterpret_cast<const tile::Frag<T, VW>*>(slot(stage, (h * 4 + j) * Tile<T, VW>::kF + f));
  }
};

template <class T, int VW>
__global__ void __launch_bounds__(kTileThreads, 2) block_kernel_staged(QuantArgs a, int64_t col_tiles, int64_t tiles) {
  using R = Ring<T, VW>;
  extern __shared__ uint4 ring_raw[];
  const R ring{ring_raw};
  const int64_t step = gridDim.x;
#pragma unroll
  for (int s = 0; s < R::kStages - 1; ++s) {
    if (blockIdx.x + s * step < tiles) ring.issue(a, col_tiles, blockIdx.x + s * step, s);
    tile::cp_async_commit();
  }
  int stage = 0;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += step) {
    const int64_t ahead = tile + (R::kStages - 1) * step;  // into the stage read one tile ago
    if (ahead < tiles) ring.issue(a, col_tiles, ahead, (stage + R::kStages - 1) % R::kStages);
    tile::cp_async_commit();
    tile::cp_async_wait<R::kStages - 1>();  // this tile's group has landed
    typename Tile<T, VW>::Frags v[2];
    ring.read(stage, v);
    block_tile<T, VW>(a, col_tiles, tile / col_tiles, tile % col_tiles, v);
    stage = (stage + 1) % R::kStages;
  }
  tile::cp_async_wait<0>();
}

}  // namespace

// The staged kernel for x's 16-byte fragments; a CTA a tile for single elements and for gated
// products (two inputs would double the ring).
template <class T, int VW, class Src>
void launch_blocks(const QuantArgs& a, int sms, cudaStream_t stream) {
  const int64_t col_tiles = (a.cols + kBlock - 1) / kBlock;
  const int64_t tiles = col_tiles * ((a.rows + kBlock - 1) / kBlock);
  if constexpr (VW == 1 || !std::is_same_v<Src, Plain>) {
    block_kernel<T, VW, Src><<<unsigned(tiles), kTileThreads, 0, stream>>>(a, col_tiles);
  } else {
    using R = Ring<T, VW>;
    runtime::allow_dynamic_smem(reinterpret_cast<const void*>(block_kernel_staged<T, VW>), R::kBytes);
    const int64_t grid = std::min<int64_t>(tiles, int64_t(sms) * R::kResident);
    block_kernel_staged<T, VW><<<unsigned(grid), kTileThreads, R::kBytes, stream>>>(a, col_tiles, tiles);
  }
  TESSERA_LAUNCH_CHECK();
}

#define TESSERA_FLOAT8_BLOCKS(T, VW)                                                              \
  template void launch_blocks<T, VW, Plain>(const QuantArgs&, int, cudaStream_t);                 \
  template void launch_blocks<T, VW, Gated<tile::Silu>>(const QuantArgs&, int, cudaStream_t);     \
  template void launch_blocks<T, VW, Gated<tile::GeluTanh>>(const QuantArgs&, int, cudaStream_t);
TESSERA_FLOAT8_BLOCKS(float, 4)
TESSERA_FLOAT8_BLOCKS(float, 1)
TESSERA_FLOAT8_BLOCKS(__half, 8)
TESSERA_FLOAT8_BLOCKS(__half, 1)
TESSERA_FLOAT8_BLOCKS(__nv_bfloat16, 8)
TESSERA_FLOAT8_BLOCKS(__nv_bfloat16, 1)
#undef TESSERA_FLOAT8_BLOCKS

}  // namespace tessera::float8
