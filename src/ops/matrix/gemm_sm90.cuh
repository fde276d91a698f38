// The Hopper GEMM kernel: TMA loads into a ring of shared-memory stages, wgmma on two consumer
// warpgroups, one producer warp, a persistent grid walking the output tiles in grouped order.
// Inputs bf16 or fp16 (any of the four layouts), float32 as tf32 and fp8 (both K-major: wgmma
// transposes 16-bit operands only). A stage is 128 bytes of K whatever the dtype.
//
// FLOPs and bytes: 2 M N K FLOPs against (M K + K N) * 2 + M N * sizeof(out) bytes at least; a
// 128 x 256 tile with 64-deep K steps does 2 * 128 * 256 * 64 FLOPs per 48 KB loaded from L2, so
// the kernel is bound by the tensor cores, not by memory, from a few hundred on in every
// dimension. What it must do is keep the tensor cores fed: while the consumers multiply stage s,
// the producer's copies fill the stages after it; a consumer keeps one wgmma group in flight
// and releases a stage as soon as the group that read it has completed.
//
// Roles (384 threads, 3 warpgroups):
//   warpgroup 0   the producer: gives up registers (setmaxnreg), one thread issues every copy
//   warpgroups 1,2 consumers: 128 float32 accumulators per thread, shared out by the schedule
//                 (Schedule below), then the epilogue: the values written into swizzled shared
//                 memory and stored by TMA (store_tma), which drains under the next tile's main
//                 loop; or, for a residual beside an activation or beta, beta beside an
//                 activation, or an output TMA cannot address, a short loop of
//                 coalesced stores through shared memory (drain); activations swiglu and geglu through
//                 store_swiglu (gemm_sm90_swiglu.cuh), in the kernels of kSwigluKernel only
// Work (gemm_sm90_work.cuh, with the tile sizes, schedules and shared memory): whole tiles, and
// where the last wave would run partly empty, its tiles as chunks of K that sum their partials
// together (sum_chunks).
// Operands: K-major (K contiguous) or MN-major (M or N contiguous, 16-bit), each its own template
// flag; the copy engine writes either in the 128-byte swizzle and wgmma reads it with its
// transpose flag, so no layout is copied first.
// Barriers per stage: `full` (the producer's expect + the copy engine's bytes) and `empty` (one
// arrival per consumer warpgroup once its wgmma that read the stage has completed; block-scaled,
// one per consumer warp once it has also read the stage's column scales).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "ops/matrix/gemm_sm90_stage.cuh"
#include "ops/matrix/gemm_sm90_swiglu.cuh"
#include "ops/matrix/gemm_sm90_work.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tma.hpp"
#include "tile/bulk.cuh"
#include "tile/smem.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/wgmma.cuh"

namespace tessera::matrix::sm90 {

__device__ __forceinline__ void load_box(void* dst, const CUtensorMap* map, bool batched, int c0,
                                         int c1, int b, const tile::BulkBarrier& bar) {
  if (batched) tile::tma_load(dst, map, c0, c1, b, bar);
  else tile::tma_load(dst, map, c0, c1, bar);
}

// One stage of an operand: `rows` rows (of M or N) from `row` on, K from `k` on. K-major: one box
// of kBK x rows. MN-major (16-bit only): rows / 64 boxes of 64 x kBK, one per 64-wide column block.
template <class T, bool KMajor, int Rows>
__device__ __forceinline__ void load_operand(T* dst, const CUtensorMap* map, Operand op, int k,
                                             int row, int b, const tile::BulkBarrier& bar) {
  if constexpr (KMajor) {
    load_box(dst, map, op.batched, k, row, b, bar);
  } else {
#pragma unroll
    for (int c = 0; c < Rows / 64; ++c)
      load_box(dst + c * 64 * kBK<T>, map, op.batched, row + c * 64, k, b, bar);
  }
}

// The descriptor of step `k` (32 bytes of K) of a stage's operand, from row `row0` (a multiple
// of 64).
template <class T, bool KMajor>
__device__ __forceinline__ uint64_t operand_desc(const T* tile, int row0, int k) {
  if constexpr (KMajor) return tile::wgmma::kmajor_sw128(tile + row0 * kBK<T>) + 2 * k;
  else return tile::wgmma::mnmajor_sw128(tile + row0 * kBK<T>, 64 * kBK<T> * sizeof(T)) + 128 * k;
}

// The CTA's unit j: the fixed stride's, or (grouped) the next from the counter, published in slot
// j of the deal ring for the consumers (dealt_unit). The producer's thread alone calls it.
template <class T, class S>
__device__ __forceinline__ int64_t deal_unit(Smem<T, S>& s, const Work& work, int64_t j) {
  if (!work.next) return blockIdx.x + j * gridDim.x;
  const int slot = int(j % kDealSlots);
  tile::BulkBarrier{&s.deal_empty[slot]}.wait((uint32_t(j / kDealSlots) & 1) ^ 1);
  const int64_t t = j == 0 ? int64_t(blockIdx.x) : gridDim.x + int64_t(atomicAdd(work.next, 1));
  s.deal[slot] = int(t);
  tile::BulkBarrier{&s.deal_full[slot]}.arrive();
  return t;
}

// A consumer thread's unit j, as deal_unit dealt it.
template <class T, class S>
__device__ __forceinline__ int64_t dealt_unit(Smem<T, S>& s, const Work& work, int64_t j) {
  if (!work.next) return blockIdx.x + j * gridDim.x;
  const int slot = int(j % kDealSlots);
  tile::BulkBarrier{&s.deal_full[slot]}.wait(uint32_t(j / kDealSlots) & 1);
  const int64_t t = s.deal[slot];
  tile::BulkBarrier{&s.deal_empty[slot]}.arrive();
  return t;
}

// The producer: one thread walks the same tiles as the consumers and fills the ring.
// Where the producer copies B's scales from in the block-scaled schedule where they go by columns
// (Epilogue::b_columns, wgrad's): block kb's scales of the columns from c are p + kb * sk + c on,
// contiguous. Null (not copied: the consumers load them) where the copy engine cannot take them:
// unless rows start 16-byte aligned and N is a multiple of 4, so that a tile's copy, a multiple of
// 16 bytes, ends inside its row.
struct ColumnScales {
  const float* p = nullptr;
  int64_t sk = 0, n = 0;
  template <class OutT>
  __host__ __device__ static ColumnScales of(const Epilogue<OutT>& e, int64_t n) {
    const bool fits = e.blocks_b && e.b_columns && e.bb_sn == 1 && e.bb_sk % 4 == 0 && n % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(e.blocks_b) % 16 == 0;
    return fits ? ColumnScales{e.blocks_b, e.bb_sk, n} : ColumnScales{};
  }
};

template <class T, class S, bool KA, bool KB>
__device__ void produce(Smem<T, S>& s, const CUtensorMap* map_a, const CUtensorMap* map_b,
                        Operand a, Operand b, const Work& work, const ColumnScales& cs) {
  constexpr int BN = S::BN, kStages = S::kStages;
  constexpr uint32_t kBytes = (kBM + BN) * kBK<T> * sizeof(T);
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t j = 0;; ++j) {
    const int64_t t = deal_unit(s, work, j);
    if (t >= work.count(s.prefix)) {
      if (S::kPingPong) deal_unit(s, work, j + 1);  // the consumers take alternate units: one end each
      break;
    }
    const Work::Unit w = work.at(t, s.prefix);
    const int64_t batch = w.batch;
    const int tn = w.tn;
    for (int kb = w.kb0; kb < w.kb1; ++kb) {
      const tile::BulkBarrier full{&s.full[stage]}, empty{&s.empty[stage]};
      empty.wait(phase ^ 1);  // a fresh barrier's preceding phase counts as complete
      const int64_t cols = S::kBlocks && cs.p ? std::min(int64_t(BN), cs.n - int64_t(tn) * BN) : 0;
      full.expect(kBytes + uint32_t(cols) * 4);
      load_operand<T, KA, kBM>(s.a[stage], map_a, a, kb * kBK<T>, int(w.m0), int(batch), full);
      load_operand<T, KB, BN>(s.b[stage], map_b, b, kb * kBK<T>, tn * BN, int(batch), full);
      if (cols) full.copy(s.col_scales[stage], cs.p + kb * cs.sk + int64_t(tn) * BN, uint32_t(cols) * 4);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
}

// One epilogue pass of a consumer warpgroup: the kEpiCols columns from `col0` of its Rows rows
// from `row0`, read from `buf` four columns a thread, a row segment per 8 threads (coalesced
// stores), the activation chosen and the bias loaded once per pass. A call: inlined into the
// unrolled loop of passes, every activation's code would be copied into each pass.
template <int Rows, class OutT>
__device__ __noinline__ void drain(const Epilogue<OutT>& kernel_epi, const float* buf, int64_t batch,
                                   int64_t row0, int64_t col0, int64_t m, int64_t n, int tid) {
  const Epilogue<OutT> epi = kernel_epi.resolved();
  constexpr int kQuads = kEpiCols / 4, kRowsPerStep = 128 / kQuads;
  const int quad = tid % kQuads;
  const int64_t col = col0 + 4 * quad;
  if (col >= n) return;
  const auto lo = epi.cols(col, col + 1 < n);
  const bool hi = col + 2 < n;
  const auto hi_cols = epi.cols(hi ? col + 2 : col, col + 3 < n);
  const int rows = m - row0 < Rows ? int(m - row0) : Rows;
  epi.template with_activation<!std::is_same_v<OutT, float>>([&](auto act) {
#pragma unroll 2
    for (int r = tid / kQuads; r < rows; r += kRowsPerStep) {
      const float4 v = *reinterpret_cast<const float4*>(&buf[r * kEpiStride + 4 * quad]);
      const auto row = epi.row(batch, row0 + r);
      epi.store_pair(row, lo, v.x, v.y, act);
      if (hi) epi.store_pair(row, hi_cols, v.z, v.w, act);
    }
  });
}

// The activation over a warp's rows of a staged sub-tile (warp_box: Frags boxes of 16 128-byte
// rows): `from` into `to` (or in place), 16 bytes a lane at a time: a loop over the buffer, not
// the accumulators, and a call, not inlined into the unrolled loop of sub-tiles, so each
// activation's code appears once per kernel.
template <int Frags, class OutT>
__device__ __noinline__ void activate_staged(const Epilogue<OutT>& epi, const unsigned char* from,
                                             unsigned char* to, int warp, int lane) {
  epi.template with_activation<!std::is_same_v<OutT, float>>([&](auto act) {
#pragma unroll 1
    for (int i = lane; i < Frags * kWarpRows * 128 / 16; i += 32) {
      const int at = warp_box(warp, i / (kWarpRows * 128 / 16)) / 16 + i % (kWarpRows * 128 / 16);
      uint4 raw = reinterpret_cast<const uint4*>(from)[at];
      OutT* v = reinterpret_cast<OutT*>(&raw);
#pragma unroll
      for (int e = 0; e < 16 / int(sizeof(OutT)); ++e) v[e] = tile::from_float<OutT>(act(tile::to_float(v[e])));
      reinterpret_cast<uint4*>(to)[at] = raw;
    }
  });
}

// The consumer's tile (rows from `row0`, columns from `col0`; the sub-tiles of the column groups
// [g0, g1)) by TMA stores, 128 bytes of columns (a sub-tile) at a time, through one of two
// staging buffers in the 128-byte swizzle: alpha * acc + bias (+ beta times the old output,
// brought into the buffer by a TMA load first) written from the accumulators, then the
// activation over the buffer (a residual is loaded by TMA as beta's old output is, and added with
// a factor of 1). Each warp stores its own rows (warp_box) and waits only until its
// store before the previous one has read its buffer: no barrier across the warpgroup, so the
// writes into shared memory are all the epilogue costs the tensor cores, and the stores drain
// under the next tile's main loop. `maps` are the output's and the pre-activation's (OutMaps):
// with a pre-activation output, it stays in the buffer and the activation goes into the other
// one, both stored. Beta = false leaves out beta's code (no activation comes with beta: out_path):
// the epilogue runs once per tile, so its code is fetched cold, and each branch inside the
// unrolled sub-tiles costs the fetch that follows it.
template <class S, class OutT, bool Beta, int Frags, int Acc>
__device__ __forceinline__ void store_tma(unsigned char* out, uint64_t* old_bar, const CUtensorMap* maps,
                                          OutPath path, const Epilogue<OutT>& epi, float alpha,
                                          const float (&acc)[Frags][Acc],
                                          int64_t batch, int64_t row0, int64_t col0, int64_t n,
                                          int g0, int g1, int& flip, uint32_t& old_phase) {
  constexpr int kCols = 128 / int(sizeof(OutT)), kBytes = S::kRows * 128;
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  // What the buffer holds before the values are added to it: beta's old output, or the residual
  // (which comes without beta, an activation or a pre-activation output: out_path).
  const bool aux = epi.z != nullptr;
  const bool beta = Beta && (epi.beta != 0.0f || epi.residual != nullptr);
  const bool activated = aux || epi.activation != Activation::none;
  const int b = int(batch);
#pragma unroll
  for (int p = 0; p < S::BN / kCols; ++p) {
    if (p * kCols < 8 * g0 || p * kCols >= 8 * g1) continue;
    unsigned char* buf = out + flip * kBytes;
    unsigned char* act_buf = aux ? out + (flip ^ 1) * kBytes : buf;
    if (!aux) flip ^= 1;
    const int x = int(col0) + p * kCols, y = int(row0) + kWarpRows * warp;  // + 64 f
    const tile::BulkBarrier old{old_bar};
    if (lane == 0) {
      if (aux) tile::bulk_wait_read<0>();
      else tile::bulk_wait_read<1>();
      if (beta) {  // the old output's (or the residual's) rows, in the same swizzle, where v goes
        old.expect(Frags * kWarpRows * 128);
#pragma unroll
        for (int f = 0; f < Frags; ++f) {
          unsigned char* to = buf + warp_box(warp, f);
          if (path == kTma3) tile::tma_load(to, maps + 2, x, y + 64 * f, b, old);
          else tile::tma_load(to, maps + 2, x, y + 64 * f, old);
        }
      }
    }
    __syncwarp();
    if (beta) old.wait(old_phase), old_phase ^= 1;
    // The sub-tile's bias, a pair of columns per 8-column group, loaded once for its fragments.
    float2 bias[kCols / 8];
#pragma unroll
    for (int i = 0; i < kCols / 8; ++i) bias[i] = make_float2(0.0f, 0.0f);
    if (epi.bias) {
#pragma unroll
      for (int i = 0; i < kCols / 8; ++i) {
        const int64_t c = col0 + p * kCols + 8 * i + 2 * (lane % 4);
        const auto cols = epi.cols(c < n ? c : 0, c + 1 < n);
        bias[i] = make_float2(cols.bias0, cols.bias1);
      }
    }
    stage_block<OutT, Frags, Beta>(buf, !beta ? 0.0f : epi.beta != 0.0f ? epi.beta : 1.0f, [&](int f, int j) {
      const int a = 4 * (p * kCols / 8) + j;
      return make_float2(alpha * acc[f][a] + bias[j / 4].x, alpha * acc[f][a + 1] + bias[j / 4].y);
    });
    if (activated) {
      __syncwarp();
      activate_staged<Frags>(epi, buf, act_buf, warp, lane);
    }
    tile::fence_async_shared();
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int f = 0; f < Frags; ++f) {
        const unsigned char* from = act_buf + warp_box(warp, f);
        if (path == kTma3) tile::tma_store(maps, x, y + 64 * f, b, from);
        else tile::tma_store(maps, x, y + 64 * f, from);
        if (aux && path == kTma3) tile::tma_store(maps + 1, x, y + 64 * f, b, buf + warp_box(warp, f));
        else if (aux) tile::tma_store(maps + 1, x, y + 64 * f, buf + warp_box(warp, f));
      }
      tile::bulk_commit();
    }
  }
}

// The 8-column groups [g0, g1) of its tile that a unit stores: all of a whole tile; of a split
// tile, chunk c's share of the tile's Subtiles (128-byte column blocks of the output, each one
// TMA store or a few of drain's passes).
template <int BN, int Subtiles>
__device__ __forceinline__ void unit_groups(const Work& work, const Work::Unit& w, int& g0, int& g1) {
  constexpr int kGroups = BN / 8 / Subtiles;
  const int parts = w.split >= 0 ? work.splits : 1;
  g0 = w.chunk * Subtiles / parts * kGroups;
  g1 = (w.chunk + 1) * Subtiles / parts * kGroups;
}

// Chunk w.chunk of a split tile: leaves this consumer's partial sums, counts itself in and waits
// for the tile's other chunks (the plan puts them all in one wave), then sums every chunk's
// partials of the column groups [g0, g1) in chunk order into `acc`: each chunk then stores its
// share of the tile, and the sums have the same bits whatever the order of arrival. Partials lie
// as the accumulators do, float4 q of thread t at 4 (128 q + t): coalesced both ways. Group i of
// fragment f is float4 (Acc / 4) f + i (columns 8 i + 2 (l % 4), + 1, rows l / 4 and + 8).
template <int Step, int Frags, int Acc>
__device__ __forceinline__ void sum_chunks(float (&acc)[Frags][Acc], const Work& work,
                                           const Work::Unit& w, int g0, int g1, int wg) {
  constexpr int kQuads = Frags * Acc / 4;
  const int tid = threadIdx.x % 128;
  const int64_t chunk_stride = int64_t(kConsumers) * kQuads * 128;  // float4s
  float4* first = reinterpret_cast<float4*>(work.partials) +
                  (w.split * work.splits * kConsumers + wg) * int64_t(kQuads * 128);
#pragma unroll
  for (int q = 0; q < kQuads; ++q) {
    const float* a = &acc[q / (Acc / 4)][4 * (q % (Acc / 4))];
    __stcg(&first[w.chunk * chunk_stride + q * 128 + tid], make_float4(a[0], a[1], a[2], a[3]));
  }
  int* arrive = &work.counters[2 * (w.split * kConsumers + wg)];
  int* depart = arrive + 1;
  __threadfence();
  tile::group_sync(1 + wg, 128);
  if (g0 == g1) {  // more chunks than sub-tiles: this one stores nothing, so waits for nothing
    if (tid == 0) tile::count_in(arrive), tile::count_out(arrive, depart, work.splits);
    return;
  }
  if (tid == 0) {
    tile::count_in(arrive), tile::wait_count(arrive, work.splits);
    tile::count_out(arrive, depart, work.splits);
  }
  tile::group_sync(1 + wg, 128);
  // A block of Step float4s (a sub-tile's groups) of every chunk at a time: loads in flight
  // without spilling the accumulators.
#pragma unroll
  for (int q0 = 0; q0 < kQuads; q0 += Step) {
    if (q0 < g0 || q0 >= g1) continue;
    for (int c = 0; c < work.splits; ++c) {
      float4 v[Step];
#pragma unroll
      for (int q = 0; q < Step; ++q) v[q] = __ldcg(&first[c * chunk_stride + (q0 + q) * 128 + tid]);
#pragma unroll
      for (int q = 0; q < Step; ++q) {
        float* a = &acc[(q0 + q) / (Acc / 4)][4 * ((q0 + q) % (Acc / 4))];
        if (c == 0) a[0] = v[q].x, a[1] = v[q].y, a[2] = v[q].z, a[3] = v[q].w;
        else a[0] += v[q].x, a[1] += v[q].y, a[2] += v[q].z, a[3] += v[q].w;
      }
    }
  }
}

// Row-wise scales (scaled_mm): each accumulator times its row's and its column's scale, in
// registers before the epilogue, which then stores it as any product (alpha carries no scale).
// The scales are L2 reads of a few hundred cycles each, and the epilogue's loads would hold up
// both consumers with the tensor cores idle; registers to hold them over the main loop there are
// none (the accumulators take 128 of 168). So as a tile's main loop starts, its consumer's
// threads ask for the scales' lines in L1 (prefetch_scales: one line a thread, no register held;
// the main loop's TMA traffic bypasses L1, so the lines stay), and the epilogue reads them from
// there, the columns' in pairs where they are 8-byte aligned. Rows past m and columns past n
// (never stored) read the last row's and column's scales.
// Value 4 i + 2 r (+ 1) of fragment f is row 64 f + 16 w + l / 4 + 8 r, column 8 i + 2 (l % 4) (+ 1).
template <int Rows, int BN, class OutT>
__device__ __forceinline__ void prefetch_scales(const Epilogue<OutT>& epi, int64_t row0, int64_t col0, int64_t m,
                                                int64_t n) {
  constexpr int kPerLine = 128 / sizeof(float), kRowLines = Rows / kPerLine, kColLines = BN / kPerLine;
  const int tid = threadIdx.x % 128;
  const float* p = nullptr;
  if (tid < kRowLines && row0 + tid * kPerLine < m) p = epi.row_scales + row0 + tid * kPerLine;
  else if (tid >= kRowLines && tid < kRowLines + kColLines && col0 + (tid - kRowLines) * kPerLine < n)
    p = epi.col_scales + col0 + (tid - kRowLines) * kPerLine;
  if (p) asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

template <class OutT, int Frags, int Acc>
__device__ __forceinline__ void scale_accumulators(float (&acc)[Frags][Acc], const Epilogue<OutT>& epi,
                                                   int64_t row0, int64_t col0, int64_t m, int64_t n) {
  const int warp = threadIdx.x % 128 / 32, lane = threadIdx.x % 32;
  float row[Frags][2];
#pragma unroll
  for (int f = 0; f < Frags; ++f)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t at = row0 + 64 * f + kWarpRows * warp + lane / 4 + 8 * r;
      row[f][r] = __ldg(epi.row_scales + (at < m ? at : m - 1));
    }
#pragma unroll
  for (int i = 0; i < Acc / 4; ++i) {
    const int64_t col = col0 + 8 * i + 2 * (lane % 4);
    float2 c;
    c.x = __ldg(epi.col_scales + (col < n ? col : n - 1));
    c.y = __ldg(epi.col_scales + (col + 1 < n ? col + 1 : n - 1));
#pragma unroll
    for (int f = 0; f < Frags; ++f)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        acc[f][4 * i + 2 * r] *= row[f][r] * c.x;
        acc[f][4 * i + 2 * r + 1] *= row[f][r] * c.y;
      }
  }
}

// Block-wise scales (BlockScaled, whole tiles): each stage, one kScaleBlock-deep block of K,
// multiplied into `part` alone, then added to acc times its rows' and its columns' scales (one
// per tile where B's blocks are 128 x 128, else one per column: b_columns). No load's latency
// falls between two blocks' products: the rows' scales and the tile's (L2 loads, a few hundred
// cycles) are loaded a block ahead into registers through pointers advanced a block at a time,
// and the columns' 128 (32 a thread, too many to hold a block ahead beside part and acc) come
// with the stage (ColumnScales; else loaded after the product). Rows past m and columns past n
// (never stored) read the last row's and column's scales. Between a block's product and its
// promotion goes what the next block's product waits for: its scales' loads and its stage's
// barrier. Value 4 i + 2 r + c is row 16 w + l / 4 + 8 r, column 8 i + 2 (l % 4) + c of the
// consumer's.
template <class Mma, class T, class S, class OutT>
__device__ __forceinline__ void block_scaled_loop(Smem<T, S>& s, const Epilogue<OutT>& epi, float (&acc)[S::BN / 2],
                                                  int& stage, uint32_t& phase, int kb0, int blocks, int rows0,
                                                  int64_t row0, int64_t col0, int64_t m, int64_t n) {
  static_assert(kBK<T> == kScaleBlock && S::BN == kScaleBlock, "a stage is one block of K, a tile one of N");
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const float* pa[2];
#pragma unroll
  for (int r = 0; r < 2; ++r)
    pa[r] = epi.blocks_a + std::min(row0 + kWarpRows * warp + lane / 4 + 8 * r, m - 1) * epi.ba_sm + kb0 * epi.ba_sk;
  const bool columns = epi.b_columns, staged = ColumnScales::of(epi, n).p != nullptr;
  // B's scales of block kb0: the tile's, or (columns) the thread's first column's; its 32
  // columns are col + 8 j + c (c = 0, 1).
  const int64_t col = columns ? col0 + 2 * (lane % 4) : col0 / kScaleBlock;
  const float* pb = epi.blocks_b + kb0 * epi.bb_sk + std::min(col, n - 1) * epi.bb_sn;
  float part[S::BN / 2], sa[2], next_a[2], sb = 0.0f, next_b[1] = {0.0f};
  const auto ahead = [&] {  // the next block's rows' and tile's scales
#pragma unroll
    for (int r = 0; r < 2; ++r) next_a[r] = __ldg(pa[r]), pa[r] += epi.ba_sk;
    if (!columns) next_b[0] = __ldg(pb), pb += epi.bb_sk;
  };
#pragma unroll
  for (int i = 0; i < S::BN / 2; ++i) acc[i] = 0.0f;
  if (blocks > 0) ahead(), tile::BulkBarrier{&s.full[stage]}.wait(phase);
  for (int kb = 0; kb < blocks; ++kb) {
    tile::wgmma::fence();
#pragma unroll
    for (int k = 0; k < kKSteps; ++k)
      Mma::run(part, operand_desc<T, true>(s.a[stage], rows0, k), operand_desc<T, true>(s.b[stage], 0, k), k > 0);
    tile::wgmma::commit();
    tile::wgmma::fence_operands(next_a);  // read here, not hoisted above the wgmma
    tile::wgmma::fence_operands(next_b);
    sa[0] = next_a[0], sa[1] = next_a[1], sb = next_b[0];
    const int done = stage;
    if (++stage == S::kStages) stage = 0, phase ^= 1;
    if (kb + 1 < blocks) ahead(), tile::BulkBarrier{&s.full[stage]}.wait(phase);
    tile::wgmma::wait<0>();
    tile::wgmma::fence_operands(part);
    if (columns) {
      const auto promote = [&](auto pair) {  // pair(j): the scales of columns col + 8 j + c
#pragma unroll
        for (int j = 0; j < S::BN / 8; ++j) {  // values 4 j + 2 r + c
          const float2 c2 = pair(j);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            acc[4 * j + i] = fmaf(part[4 * j + i], sa[i / 2] * (i % 2 ? c2.y : c2.x), acc[4 * j + i]);
        }
      };
      if (staged) {
        const float* cs = s.col_scales[done] + 2 * (lane % 4);
        promote([&](int j) { return *reinterpret_cast<const float2*>(cs + 8 * j); });
      } else {
        const int64_t first = std::min(col, n - 1);
        const auto at = [&](int64_t c) { return __ldg(pb + (std::min(c, n - 1) - first) * epi.bb_sn); };
        promote([&](int j) { return make_float2(at(col + 8 * j), at(col + 8 * j + 1)); });
        pb += epi.bb_sk;
      }
    } else {  // one scale of B's for the tile: a product a row, then one fma a value
      const float s2[2] = {sa[0] * sb, sa[1] * sb};
#pragma unroll
      for (int i = 0; i < S::BN / 2; ++i) acc[i] = fmaf(part[i], s2[i / 2 % 2], acc[i]);
    }
    if (lane == 0) tile::BulkBarrier{&s.empty[done]}.arrive();  // each warp, after its reads of the stage
  }
}

// Depth: zeroes the rows of K outside [lo, hi) (stage-relative) of this consumer's share of a
// stage that a group shares with its neighbour: its 64-wide block of A, and half of B's (both
// MN-major: a K row is 128 contiguous bytes of each block, wherever the swizzle puts its chunks),
// then a barrier of both consumers, so that neither multiplies before the other has masked.
template <class T, class S>
__device__ __noinline__ void mask_stage(Smem<T, S>& s, int stage, int lo, int hi, int wg) {
  constexpr int kRowChunks = 128 / 16, kBlockBytes = 64 * kBK<T> * int(sizeof(T));
  constexpr int kBBlocks = S::BN / 64 / kConsumers;
  unsigned char* a = reinterpret_cast<unsigned char*>(s.a[stage]) + wg * kBlockBytes;
  unsigned char* b = reinterpret_cast<unsigned char*>(s.b[stage]) + wg * kBBlocks * kBlockBytes;
  for (int i = threadIdx.x % 128; i < (1 + kBBlocks) * kBK<T> * kRowChunks; i += 128) {
    const int block = i / (kBK<T> * kRowChunks), row = i / kRowChunks % kBK<T>, chunk = i % kRowChunks;
    if (row >= lo && row < hi) continue;
    unsigned char* base = block == 0 ? a : b + (block - 1) * kBlockBytes;
    *reinterpret_cast<uint4*>(base + row * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
  }
  tile::fence_async_shared();
  tile::group_sync(3, 128 * kConsumers);
}

// Consumer `wg`: its tiles are the CTA's j-th (every one: cooperative; j = wg, wg + 2, ...:
// pingpong). Tile j's K blocks are the ring's positions j * k_blocks on.
template <class T, class OutT, class S, bool KA, bool KB>
// `epi` is the kernel's parameter, read where used rather than held in registers beside the
// accumulators; alpha with the device scales folded in is computed once.
__device__ void consume(Smem<T, S>& s, const Epilogue<OutT>& epi, const CUtensorMap* maps,
                        OutPath kernel_path, const Work& work, int64_t m_all, int64_t n, int wg) {
  constexpr int BN = S::BN, kStages = S::kStages, kFrags = S::kRows / 64;
  using Mma = tile::wgmma::Mma<T, BN, KA ? 0 : 1, KB ? 0 : 1>;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int rows0 = S::kPingPong ? 0 : wg * 64;  // the consumer's first row in the tile
  float acc[kFrags][BN / 2];
  int64_t pos = 0;  // the ring position of the unit's first K block
  int flip = 0;     // the staging buffer of the next TMA store
  uint32_t old_phase = 0;  // of s.old[wg][warp]
  const float alpha = epi.resolved().alpha;
  for (int64_t j = S::kPingPong ? wg : 0;; j += S::kPingPong ? kConsumers : 1) {
    const int64_t t = dealt_unit(s, work, j);
    if (t >= work.count(s.prefix)) break;
    const Work::Unit w = work.at(t, s.prefix);
    const int64_t batch = w.batch;
    const int blocks = w.kb1 - w.kb0;
    // Pingpong: wait for the other consumer to be done with tile j - 1's ring positions, so
    // that this one waits on no barrier more than one phase ahead. Its units are whole tiles, so
    // tile j's blocks are the ring's positions j * k_blocks on.
    if (S::kPingPong && j > 0) tile::BulkBarrier{&s.turn[wg]}.wait(uint32_t((j - 1) / 2) & 1);
    if (S::kPingPong) pos = j * work.k_blocks;
    int stage = int(pos % kStages), prev = 0;
    uint32_t phase = uint32_t(pos / kStages) & 1;
    pos += blocks;
    const int64_t row0 = int64_t(w.m0) + rows0, col0 = int64_t(w.tn) * BN;
    // With beta, this tile's old output into L2 a few stages before the epilogue reads it, a row
    // a thread, so that the epilogue's reads do not wait on DRAM.
    const int prefetch_at = epi.prefetch && tid < S::kRows && row0 + tid < m_all ? max(0, blocks - kStages) : -1;
    if constexpr (sizeof(T) == 1 && !S::kBlocks)
      if (epi.row_scales) prefetch_scales<S::kRows, BN>(epi, row0, col0, m_all, n);
    if constexpr (S::kBlocks) {
      block_scaled_loop<Mma>(s, epi, acc[0], stage, phase, w.kb0, blocks, rows0, row0, col0, m_all, n);
    } else {
      for (int kb = 0; kb < blocks; ++kb) {
        if (kb == prefetch_at) epi.prefetch_row(batch, row0 + tid, col0, min(int64_t(BN), n - col0));
        tile::BulkBarrier{&s.full[stage]}.wait(phase);
        if constexpr (!S::kPingPong && !KA && !KB)
          if (work.depth) {
            const int k0 = (w.kb0 + kb) * kBK<T>;
            if (k0 < w.k_begin || k0 + kBK<T> > w.k_end) mask_stage(s, stage, w.k_begin - k0, w.k_end - k0, wg);
          }
        tile::wgmma::fence();
#pragma unroll
        for (int k = 0; k < kKSteps; ++k)
#pragma unroll
          for (int f = 0; f < kFrags; ++f)
            Mma::run(acc[f], operand_desc<T, KA>(s.a[stage], rows0 + 64 * f, k),
                     operand_desc<T, KB>(s.b[stage], 0, k), kb > 0 || k > 0);
        tile::wgmma::commit();
        tile::wgmma::wait<1>();  // the previous stage's group has completed: release it
        if (kb > 0 && tid == 0) tile::BulkBarrier{&s.empty[prev]}.arrive();
        prev = stage;
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
      if (S::kPingPong && tid == 0) tile::BulkBarrier{&s.turn[1 - wg]}.arrive();
      tile::wgmma::wait<0>();
      if (tid == 0 && blocks > 0) tile::BulkBarrier{&s.empty[prev]}.arrive();
    }
    if (blocks == 0)  // depth: an empty group's product
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) acc[f][i] = 0.0f;
#pragma unroll
    for (int f = 0; f < kFrags; ++f) tile::wgmma::fence_operands(acc[f]);
    // A grouped tile whose rows pass its group's end stores through its group's map, which stops
    // there (the output's would write the next group's rows), or through drain.
    const int64_t m = w.m_end < m_all ? w.m_end : m_all;
    const bool past_end = work.groups && w.m0 + kBM > m;
    const OutPath path = past_end && !work.group_maps ? kDrain : kernel_path;
    int g0, g1;  // the column groups this unit stores
    unit_groups<BN, kSubtiles<S, OutT>>(work, w, g0, g1);
    if constexpr (!S::kPingPong)  // pingpong's units are whole tiles
      if (w.split >= 0) sum_chunks<BN / 8 / kSubtiles<S, OutT>>(acc, work, w, g0, g1, wg);
    if constexpr (sizeof(T) == 1)  // float8 inputs: scaled_mm's row-wise scales
      if (epi.row_scales) scale_accumulators(acc, epi, row0, col0, m, n);
    if constexpr (kSwigluKernel<T, OutT, KA, KB>)
      if (is_gated(epi.activation)) {  // whole tiles by TMA
        store_swiglu<S::kRows, BN>(s.out[wg], maps, path == kTma3, epi, alpha, acc, batch, row0, col0, n, flip);
        continue;
      }
    if (path != kDrain) {
      // 16-bit outputs without beta or a residual take a copy of the epilogue with no code for
      // them at all; a second
      // copy in the float32-output kernels would not fit beside the accumulators' registers.
      uint64_t* old = &s.old[wg][warp];
      // A grouped tile past its group's end (kGroupMaps): its own copy of the epilogue, whose
      // output map is its group's (the others' stays the kernel parameter's, which costs no
      // register).
      if (kGroupMaps<S, OutT> && past_end) {
        const CUtensorMap* own = work.group_maps + batch;
        if (lane == 0) tile::tma_map_acquire(own);
        store_tma<S, OutT, false>(s.out[wg], old, own, kTma2, epi, alpha, acc, batch, row0, col0, n, g0, g1, flip, old_phase);
      } else if (sizeof(OutT) == 2 && epi.beta == 0.0f && !epi.residual)
        store_tma<S, OutT, false>(s.out[wg], old, maps, path, epi, alpha, acc, batch, row0, col0, n, g0, g1, flip, old_phase);
      else
        store_tma<S, OutT, true>(s.out[wg], old, maps, path, epi, alpha, acc, batch, row0, col0, n, g0, g1, flip, old_phase);
      continue;
    }
    // The accumulators (fragment f: row 64 f + 16 w + l / 4 + 8 r, columns 8 i + 2 (l % 4) and
    // the next in d[4 i + 2 r], d[4 i + 2 r + 1]) through shared memory, kEpiCols columns a pass:
    // where earlier units stored by TMA, once every warp's stores have read the staging buffers.
    if (kernel_path != kDrain) {
      if (lane == 0) tile::bulk_wait_read<0>();
      tile::group_sync(1 + wg, 128);
    }
    float* buf = reinterpret_cast<float*>(s.out[wg]);
#pragma unroll
    for (int pass = 0; pass < BN / kEpiCols; ++pass) {
      if (pass * kEpiCols < 8 * g0 || pass * kEpiCols >= 8 * g1) continue;
#pragma unroll
      for (int f = 0; f < kFrags; ++f)
#pragma unroll
        for (int i = 0; i < kEpiCols / 8; ++i)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int jj = 4 * (pass * kEpiCols / 8 + i) + 2 * r;
            *reinterpret_cast<float2*>(&buf[(64 * f + warp * 16 + lane / 4 + 8 * r) * kEpiStride +
                                            8 * i + 2 * (lane % 4)]) =
                make_float2(acc[f][jj], acc[f][jj + 1]);
          }
      tile::group_sync(1 + wg, 128);
      drain<S::kRows>(epi, buf, batch, row0, col0 + pass * kEpiCols, m, n, tid);
      tile::group_sync(1 + wg, 128);
    }
  }
  if (kernel_path != kDrain && threadIdx.x % 32 == 0) tile::bulk_wait_read<0>();  // before smem goes
}

template <class T, class OutT, class S, bool KA, bool KB>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_sm90_kernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b,
                     const __grid_constant__ OutMaps maps, Operand a, Operand b, OutPath path,
                     const __grid_constant__ Epilogue<OutT> epi, const Work work, int64_t m,
                     int64_t n) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = tile::aligned_smem<Smem<T, S>, 1024>(smem_raw);
  const int role = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    tile::tma_prefetch(&map_a);
    tile::tma_prefetch(&map_b);
    if (path != kDrain) tile::tma_prefetch(&maps.c);
    if (path != kDrain && epi.z) tile::tma_prefetch(&maps.z);
    if (path != kDrain && (epi.residual || epi.beta != 0.0f)) tile::tma_prefetch(&maps.add);
    for (int i = 0; i < S::kStages; ++i) {
      tile::BulkBarrier{&s.full[i]}.init(1);
      tile::BulkBarrier{&s.empty[i]}.init(S::kBlocks ? S::kReaders * 4 : S::kReaders);  // block-scaled: a warp each
    }
    for (int i = 0; i < kConsumers; ++i) tile::BulkBarrier{&s.turn[i]}.init(1);
    for (int i = 0; i < kDealSlots; ++i) {
      tile::BulkBarrier{&s.deal_full[i]}.init(1);
      tile::BulkBarrier{&s.deal_empty[i]}.init(S::kReaders * 128);
    }
    for (int i = 0; i < kConsumers; ++i)
      for (int w = 0; w < 4; ++w) tile::BulkBarrier{&s.old[i][w]}.init(1);
    tile::bulk_barriers_ready();
  }
  if (work.groups)
    for (int i = threadIdx.x; i <= work.groups; i += kThreads) s.prefix[i] = work.prefix[i];
  __syncthreads();
  if (role == 0) {
    tile::wgmma::release_registers<40>();
    if (threadIdx.x == 0)
      produce<T, S, KA, KB>(s, &map_a, &map_b, a, b, work, S::kBlocks ? ColumnScales::of(epi, n) : ColumnScales{});
  } else {
    tile::wgmma::claim_registers<232>();
    consume<T, OutT, S, KA, KB>(s, epi, &maps.c, path, work, m, n, role - 1);
  }
}

}  // namespace tessera::matrix::sm90
