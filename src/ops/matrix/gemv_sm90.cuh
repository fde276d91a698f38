// GEMV-class products on Hopper: C = A W^T for A with M <= 16 rows (decode, small batches) and W
// [N, K] with K contiguous, the layout of a linear layer's weight. 2 M N K FLOPs on N K 2 bytes of
// W read once: at M <= 16 that is at most 16 FLOPs a byte, so the time is W's bytes over the copy
// rate, and the kernel's one job is to keep the copy engine busy on every SM.
//
// The weight streams into a ring of shared-memory stages by the copy engine, kStages deep, so the
// bytes in flight per SM are set by shared memory (~200 KB), not by registers, and nothing waits
// between batches. A stage is 16 W rows x 1024 K and A's M rows x the same K, each one tensor copy
// (a 3-D view of the operand: 64 K, rows, K / 64). The stage's shape is DRAM's: every W row is read
// in runs of 2 KB, since DRAM serves shorter runs of many rows (512 bytes, 1 KB) well below the
// copy rate (dev/worklog.md, section 10). A is re-read each stage, from L2, as M rows only (the
// copy engine's zero fill of the rest would cost more than the rows); A's rows past M are read
// from a zero row. Rows of W past N and K past the end arrive as zeros. The four consumer warps
// take a quarter of the stage's K each on mma.sync (m16n8k16: A's rows against the 16 W rows as
// two n8 tiles), both operands read by ldmatrix from the 128-byte swizzle, so the eight rows of
// one 8 x 8 block fall on distinct banks; warp 0 sums the quarters at the unit's end, in a fixed
// order.
//
// Work: units of (16 W rows, a segment of K), handed out round-robin to a persistent grid of one
// CTA per SM; K is split only where the row blocks are fewer than two an SM (plan()). Where it is,
// each unit leaves float32 partial sums and counts itself on its row block's counter; the last of
// a row block sums the segments in order (the same bits every run, whichever is last), applies
// the epilogue and sets the counter back to zero.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "ops/matrix/gemm.cuh"
#include "runtime/tma.hpp"
#include "tile/async_copy.cuh"
#include "tile/bulk.cuh"
#include "tile/mma.cuh"
#include "tile/sync.cuh"
#include "tile/smem.cuh"
#include "tile/tma.cuh"

namespace tessera::matrix::gemv {

constexpr int kMaxM = 16;
constexpr int kBlockRows = 16;             // W rows (output columns) per unit
constexpr int kStageK = 1024;              // K per stage: 16 swizzle blocks of 64
constexpr int kSub = 64;                   // K of one 128-byte swizzled row
constexpr int kStages = 3;
constexpr int kConsumers = 4;              // warps, a quarter of a stage's K each
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kStagedLd = 16 + 4;          // the epilogue's staged outputs, floats a row

struct Smem {
  struct Stage {  // [K / 64][rows][128 bytes], 128-byte swizzled
    alignas(1024) unsigned char w[kStageK / kSub][kBlockRows * 128];
    alignas(1024) unsigned char a[kStageK / kSub * kMaxM * 128];  // [K / 64][M][128 bytes]
  } stage[kStages];
  alignas(128) unsigned char zero[128];
  static_assert(kBlockRows == 16 && kMaxM == 16, "one m16 x two n8 tiles a warp");
  float out[kConsumers][kMaxM * kStagedLd];
  uint64_t full[kStages], empty[kStages];
};

struct Args {
  const void* a;
  int64_t a_sm;        // A [M, K]: K contiguous, rows 16-byte aligned
  const void* w;
  int64_t w_sn;        // W [N, K]: K contiguous, rows 16-byte aligned
  int m;
  int64_t n, k;
  int blocks;          // ceil(N / 16)
  int splits;          // segments of K
  int seg_stages;      // stages per segment (the last may have fewer)
  int k_stages;        // ceil(K / 1024)
  float* partial;      // splits > 1: [splits][M][N]
  unsigned* counters;  // splits > 1: [blocks], zero at launch and left zero
};

// The operands' tensor maps: W and A as [K / 64][rows][64] (innermost last here), boxes of a stage.
struct Maps {
  CUtensorMap w, a;
};

inline runtime::TmaShape stage_view(int64_t rows, int64_t k, int64_t row_stride, int box_rows) {
  runtime::TmaShape s;
  s.rank = 3;
  s.dims[0] = kSub, s.dims[1] = uint64_t(rows), s.dims[2] = uint64_t(k / kSub);
  s.strides[0] = 1, s.strides[1] = uint64_t(row_stride), s.strides[2] = kSub;
  s.box[0] = kSub, s.box[1] = uint32_t(box_rows), s.box[2] = kStageK / kSub;
  return s;
}

// Whether the copy engine can read both operands (`dt` 16-bit, rows K-contiguous).
inline bool can_map(DType dt, const Args& p) {
  return runtime::tma_can_map(dt, p.w, stage_view(p.n, p.k, p.w_sn, kBlockRows), runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(dt, p.a, stage_view(p.m, p.k, p.a_sm, p.m), runtime::TmaSwizzle::b128);
}

inline Maps make_maps(DType dt, const Args& p) {
  return {runtime::tma_map("matmul", dt, p.w, stage_view(p.n, p.k, p.w_sn, kBlockRows), runtime::TmaSwizzle::b128),
          runtime::tma_map("matmul", dt, p.a, stage_view(p.m, p.k, p.a_sm, p.m), runtime::TmaSwizzle::b128)};
}

struct Unit {
  int64_t block;
  int seg, st0, st1;  // stages [st0, st1) of K
};

__device__ __forceinline__ Unit unit_at(const Args& p, int64_t u) {
  Unit w;
  w.block = u / p.splits;
  w.seg = int(u % p.splits);
  w.st0 = w.seg * p.seg_stages;
  w.st1 = min(w.st0 + p.seg_stages, p.k_stages);
  return w;
}

// The producer (one thread): fills the ring in unit order, a stage by two tensor copies.
__device__ void produce(Smem& s, const Args& p, const Maps& maps, int64_t units) {
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(p, u);
    const int row0 = int(w.block * kBlockRows);
    for (int st = w.st0; st < w.st1; ++st) {
      const tile::BulkBarrier full{&s.full[stage]}, empty{&s.empty[stage]};
      empty.wait(phase ^ 1);  // a fresh barrier's preceding phase counts as complete
      full.expect(uint32_t(sizeof(Smem::Stage::w) + kStageK / kSub * p.m * 128));  // W's zero-filled rows count
      const int sub0 = st * (kStageK / kSub);
      tile::tma_load(s.stage[stage].w, &maps.w, 0, row0, sub0, full);
      tile::tma_load(s.stage[stage].a, &maps.a, 0, 0, sub0, full);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
}

// Consumer warp `warp` over its quarter of one stage: the 16 W rows against A's 16 rows, 16 steps
// of K. ldmatrix hands A's blocks (rows 0-7 / 8-15, K 0-7 / 8-15 of the step) as a0..a3 and W's
// (rows 0-7, K 0-7 and 8-15; rows 8-15, the same) as the two n8 tiles' b0, b1. In the 128-byte
// swizzle, 16-byte chunk c of the i-th 128-byte row of a copy sits at chunk c ^ (i % 8): for W, i % 8
// is lane % 8; A's rows (M a block) are numbered across its blocks, and past M read the zero row.
template <class T>
__device__ __forceinline__ void multiply_stage(float (&acc)[2][4], const Smem::Stage& st, uint32_t zero, int m,
                                               int warp, int lane) {
  constexpr int kSubs = kStageK / kSub / kConsumers;  // swizzle blocks a warp
  const int x = lane % 8, ra = x + 8 * (lane / 8 % 2);
  const uint32_t w_row = tile::smem_addr(st.w[kSubs * warp]) + uint32_t((x + 8 * (lane / 16)) * 128);
  const int a_half = lane / 16, w_half = lane / 8 % 2;
#pragma unroll
  for (int sub = 0; sub < kSubs; ++sub) {
    const int i = (kSubs * warp + sub) * m + ra;
    const uint32_t a_row = ra < m ? tile::smem_addr(st.a) + uint32_t(i * 128) : zero;
    const int xa = ra < m ? i % 8 : 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t a[4], b[4];
      tile::ldmatrix_x4<false>(a, a_row + uint32_t(((2 * j + a_half) ^ xa) << 4));
      tile::ldmatrix_x4<false>(b, w_row + uint32_t(sub * sizeof(st.w[0]) + (((2 * j + w_half) ^ x) << 4)));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      tile::mma_m16n8k16<T>(acc[0], a, b0);
      tile::mma_m16n8k16<T>(acc[1], a, b1);
    }
  }
}

// Accumulator layout (tile n8 t: d0, d1 at row g, columns 2 (l % 4) and + 1; d2, d3 at row g + 8)
// to and from a warp's staging rows, [16 rows of A][16 columns of C].
__device__ __forceinline__ void stage_acc(float* buf, const float (&v)[2][4], int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(&buf[(g + 8 * h) * kStagedLd + 8 * nt + 2 * t]) = make_float2(v[nt][2 * h], v[nt][2 * h + 1]);
}

__device__ __forceinline__ void add_staged(float (&v)[2][4], const float* buf, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float2 x = *reinterpret_cast<const float2*>(&buf[(g + 8 * h) * kStagedLd + 8 * nt + 2 * t]);
      v[nt][2 * h] += x.x, v[nt][2 * h + 1] += x.y;
    }
}

// The unit's outputs (columns n0 .. n0 + 15 of C, rows 0..M-1) through warp 0's staging rows.
template <class OutT>
__device__ __forceinline__ void store_unit(const Epilogue<OutT>& epi, float* buf, const float (&v)[2][4],
                                           const Args& p, int64_t n0, int lane) {
  stage_acc(buf, v, lane);
  __syncwarp();
  store_staged<16, 32>(epi, buf, kStagedLd, 0, 0, n0, p.m, p.n - n0 < 16 ? int(p.n - n0) : 16, lane);
  __syncwarp();
}

// Warp 0, a unit of a split K: its partial sums left as [seg][m][n]; the last unit of the row block
// (by its counter, which it sets back to zero) sums every segment's in order and stores them.
template <class OutT>
__device__ void finish_split(const Epilogue<OutT>& epi, float* buf, const float (&v)[2][4], const Args& p,
                             const Unit& w, int64_t n0, int lane) {
  const int g = lane / 4, t = lane % 4;
  const auto at = [&](int seg, int nt, int h, int e) -> float* {
    const int m = g + 8 * h;
    const int64_t n = n0 + 8 * nt + 2 * t + e;
    return m < p.m && n < p.n ? &p.partial[(int64_t(seg) * p.m + m) * p.n + n] : nullptr;
  };
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (float* q = at(w.seg, i / 4, i / 2 % 2, i % 2)) __stcg(q, v[i / 4][i % 4]);
  __threadfence();
  __syncwarp();
  unsigned last = 0;
  if (lane == 0) {
    last = atomicAdd(&p.counters[w.block], 1u) == unsigned(p.splits - 1);
    if (last) p.counters[w.block] = 0;  // this launch's last use: zero for the next
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  float sum[2][4] = {};
  for (int seg = 0; seg < p.splits; ++seg)
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (const float* q = at(seg, i / 4, i / 2 % 2, i % 2)) sum[i / 4][i % 4] += __ldcg(q);
  store_unit(epi, buf, sum, p, n0, lane);
}

// The consumers: each unit's stages multiplied (a quarter of each stage's K a warp), the quarters
// summed by warp 0, and the unit stored whole or left as partial sums.
template <class T, class OutT>
__device__ void consume(Smem& s, const Args& p, const Epilogue<OutT>& epi, int64_t units, int warp) {
  const int lane = threadIdx.x % 32;
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(p, u);
    float acc[2][4] = {};
    for (int st = w.st0; st < w.st1; ++st) {
      tile::BulkBarrier{&s.full[stage]}.wait(phase);
      multiply_stage<T>(acc, s.stage[stage], tile::smem_addr(s.zero), p.m, warp, lane);
      __syncwarp();
      if (lane == 0) tile::BulkBarrier{&s.empty[stage]}.arrive();
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    if (warp != 0) stage_acc(s.out[warp], acc, lane);
    tile::group_sync(1, 32 * kConsumers);
    if (warp == 0)
      for (int q = 1; q < kConsumers; ++q) add_staged(acc, s.out[q], lane);
    tile::group_sync(1, 32 * kConsumers);  // read before the next unit writes them
    if (warp != 0) continue;
    const int64_t n0 = w.block * kBlockRows;
    if (p.splits == 1) store_unit(epi, s.out[0], acc, p, n0, lane);
    else finish_split(epi, s.out[0], acc, p, w, n0, lane);
  }
}

template <class T, class OutT>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_kernel(const Args p, const __grid_constant__ Maps maps, const __grid_constant__ Epilogue<OutT> epi) {
  extern __shared__ unsigned char smem_raw[];
  Smem& s = tile::aligned_smem<Smem, 1024>(smem_raw);  // the 128-byte swizzle's alignment
  const int warp = threadIdx.x / 32;
  if (threadIdx.x < 32) reinterpret_cast<uint32_t*>(s.zero)[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      tile::BulkBarrier{&s.full[i]}.init(1);
      tile::BulkBarrier{&s.empty[i]}.init(kConsumers);
    }
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  const int64_t units = int64_t(p.blocks) * p.splits;
  if (warp == kConsumers) {
    if (threadIdx.x % 32 == 0) produce(s, p, maps, units);
  } else {
    consume<T, OutT>(s, p, epi, units, warp);
  }
}

// The split of K: none where there are two row blocks an SM or more (the busiest SM then has at
// most one unit more than the average, and a split unit's partial sums cost its CTA a fence and a
// counter's round trip, which the 3-stage ring does not hide). Else, among the segment lengths that
// leave at least 2 stages a segment, the one with the fewest stages on the busiest SM (units dealt
// round-robin to `sms` CTAs), the fewest splits of those.
inline void plan(Args& p, int sms) {
  p.blocks = int((p.n + kBlockRows - 1) / kBlockRows);
  p.k_stages = int((p.k + kStageK - 1) / kStageK);
  p.splits = 1, p.seg_stages = p.k_stages;
  if (p.blocks >= 2 * sms) return;
  int64_t best = INT64_MAX;
  for (int seg = p.k_stages; seg >= 1; --seg) {
    const int splits = (p.k_stages + seg - 1) / seg;
    if (splits > 1 && seg < 2) break;
    const int64_t units = int64_t(p.blocks) * splits;
    const int64_t busiest = (units + sms - 1) / sms * seg;
    if (busiest < best) best = busiest, p.splits = splits, p.seg_stages = seg;
  }
}

inline std::size_t smem_bytes() { return sizeof(Smem) + 1024; }

}  // namespace tessera::matrix::gemv
