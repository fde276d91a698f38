// GEMV-class products on Hopper: C = A W^T for A with M <= 16 rows (decode, small batches) and W
// [N, K] with K contiguous, the layout of a linear layer's weight. 2 M N K FLOPs on N K 2 bytes of
// W read once: at M <= 16 that is at most 16 FLOPs a byte, so the time is W's bytes over the copy
// rate, and the kernel's one job is to keep the copy engine busy on every SM.
//
// The weight streams into a ring of shared-memory stages by bulk copies (cp.async.bulk: contiguous
// 512-byte runs of 64 W rows and of A's M rows per stage) that one producer warp keeps kStages deep,
// so the bytes in flight per SM are set by shared memory (~200 KB), not by registers, and nothing
// waits between batches. Four consumer warps multiply each stage on mma.sync (m16n8k16: A's rows,
// zero-padded to 16, against 16 W rows a warp), both operands read by ldmatrix from rows padded to
// 528 bytes, so the eight rows of one 8 x 8 block fall on distinct banks.
//
// Work: units of (64 W rows, a segment of K), handed out round-robin to a persistent grid of one
// CTA per SM; the split of K is chosen so that the units divide evenly over the SMs (plan()). Where
// K is split, each unit leaves float32 partial sums and counts itself on its row block's counter;
// the last of a row block sums the segments in order (the same bits every run, whichever is last),
// applies the epilogue and sets the counter back to zero.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "ops/matrix/gemm.cuh"
#include "tile/async_copy.cuh"
#include "tile/bulk.cuh"
#include "tile/mma.cuh"
#include "tile/sync.cuh"

namespace tessera::matrix::gemv {

constexpr int kMaxM = 16;
constexpr int kBlockRows = 64;             // W rows (output columns) per unit
constexpr int kStageK = 256;               // K per stage: 512 bytes of a 16-bit row
constexpr int kRunBytes = kStageK * 2;     // one bulk copy per row and stage
constexpr int kPitch = kRunBytes + 16;     // a staged row: 16 bytes more shifts the next by 4 banks
constexpr int kStages = 5;
constexpr int kConsumers = 4;              // warps, 16 W rows each
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr int kStagedLd = 16 + 4;          // the epilogue's staged outputs, floats a row

struct Smem {
  struct Stage {
    alignas(128) unsigned char w[kBlockRows * kPitch];
    alignas(128) unsigned char a[kMaxM * kPitch];  // rows M..15 zero, never copied into
  } stage[kStages];
  float out[kConsumers][kMaxM * kStagedLd];
  uint64_t full[kStages], empty[kStages];
  int last;
};

struct Args {
  const void* a;
  int64_t a_sm;        // A [M, K]: K contiguous, rows 16-byte aligned
  const void* w;
  int64_t w_sn;        // W [N, K]: K contiguous, rows 16-byte aligned
  int m;
  int64_t n, k;
  int blocks;          // ceil(N / 64)
  int splits;          // segments of K
  int seg_stages;      // stages per segment (the last may have fewer)
  int k_stages;        // K / 256
  float* partial;      // splits > 1: [splits][M][N]
  unsigned* counters;  // splits > 1: [blocks], zero at launch and left zero
};

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

// The producer warp: fills the ring in unit order, lane l copying W rows l and l + 32 of the block
// and A's row l, once lane 0 has announced the stage's bytes.
template <class T>
__device__ void produce(Smem& s, const Args& p, int64_t units) {
  const int lane = threadIdx.x % 32;
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(p, u);
    const int64_t row0 = w.block * kBlockRows;
    const int rows = int(p.n - row0 < kBlockRows ? p.n - row0 : kBlockRows);
    for (int st = w.st0; st < w.st1; ++st) {
      const tile::BulkBarrier full{&s.full[stage]}, empty{&s.empty[stage]};
      empty.wait(phase ^ 1);  // a fresh barrier's preceding phase counts as complete
      if (lane == 0) full.expect(uint32_t((rows + p.m) * kRunBytes));
      __syncwarp();
      const int64_t k0 = int64_t(st) * kStageK;
      const T* wsrc = static_cast<const T*>(p.w) + row0 * p.w_sn + k0;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = lane + 32 * h;
        if (r < rows) full.copy(s.stage[stage].w + r * kPitch, wsrc + r * p.w_sn, kRunBytes);
      }
      if (lane < p.m)
        full.copy(s.stage[stage].a + lane * kPitch, static_cast<const T*>(p.a) + lane * p.a_sm + k0, kRunBytes);
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
  }
}

// Consumer warp `warp` over one stage: W rows 16 warp .. + 15 against A's 16 rows, 16 steps of K.
// ldmatrix hands A's blocks (rows 0-7 / 8-15, K 0-7 / 8-15 of the step) as a0..a3 and W's (rows
// + 0-7, K 0-7 and 8-15; rows + 8-15, the same) as the two n8 tiles' b0, b1.
template <class T>
__device__ __forceinline__ void multiply_stage(float (&acc)[2][4], const Smem::Stage& st, int warp, int lane) {
  const uint32_t a_addr = tile::smem_addr(st.a) + uint32_t((lane % 8 + 8 * (lane / 8 % 2)) * kPitch + 16 * (lane / 16));
  const uint32_t w_addr =
      tile::smem_addr(st.w) + uint32_t((16 * warp + lane % 8 + 8 * (lane / 16)) * kPitch + 16 * (lane / 8 % 2));
#pragma unroll
  for (int kk = 0; kk < kStageK / 16; ++kk) {
    uint32_t a[4], b[4];
    tile::ldmatrix_x4<false>(a, a_addr + 32 * kk);
    tile::ldmatrix_x4<false>(b, w_addr + 32 * kk);
    const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    tile::mma_m16n8k16<T>(acc[0], a, b0);
    tile::mma_m16n8k16<T>(acc[1], a, b1);
  }
}

// A unit's outputs (16 W rows of this warp: columns n0 .. n0 + 15 of C, rows 0..M-1), from `v`
// laid out as the accumulators (tile n8 t: d0, d1 at row g, columns 2 (l % 4) and + 1; d2, d3
// at row g + 8), through the warp's staging rows and store_staged.
template <class OutT>
__device__ __forceinline__ void store_unit(const Epilogue<OutT>& epi, float* buf, const float (&v)[2][4],
                                           const Args& p, int64_t n0, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(&buf[(g + 8 * h) * kStagedLd + 8 * nt + 2 * t]) = make_float2(v[nt][2 * h], v[nt][2 * h + 1]);
  __syncwarp();
  if (n0 < p.n)
    store_staged<16, 32>(epi, buf, kStagedLd, 0, 0, n0, p.m, p.n - n0 < 16 ? int(p.n - n0) : 16, lane);
  __syncwarp();
}

// The consumers: each unit's stages multiplied, then the unit stored whole, or its partial sums
// left and, by the last unit of its row block, every segment's summed in order and stored.
template <class T, class OutT>
__device__ void consume(Smem& s, const Args& p, const Epilogue<OutT>& epi, int64_t units, int warp) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float* buf = s.out[warp];
  int stage = 0;
  uint32_t phase = 0;
  for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
    const Unit w = unit_at(p, u);
    float acc[2][4] = {};
    for (int st = w.st0; st < w.st1; ++st) {
      tile::BulkBarrier{&s.full[stage]}.wait(phase);
      multiply_stage<T>(acc, s.stage[stage], warp, lane);
      __syncwarp();
      if (lane == 0) tile::BulkBarrier{&s.empty[stage]}.arrive();
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    const int64_t n0 = w.block * kBlockRows + 16 * warp;
    if (p.splits == 1) {
      store_unit(epi, buf, acc, p, n0, lane);
      continue;
    }
    // Partials [seg][m][n]: this warp's M x 16 of them.
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = g + 8 * h;
          const int64_t n = n0 + 8 * nt + 2 * t + e;
          if (m < p.m && n < p.n) __stcg(&p.partial[(int64_t(w.seg) * p.m + m) * p.n + n], acc[nt][2 * h + e]);
        }
    __threadfence();
    tile::group_sync(1, 32 * kConsumers);
    if (threadIdx.x == 0) {
      s.last = atomicAdd(&p.counters[w.block], 1u) == unsigned(p.splits - 1);
      if (s.last) p.counters[w.block] = 0;  // this launch's last use: zero for the next
    }
    tile::group_sync(1, 32 * kConsumers);
    const bool last = s.last;
    tile::group_sync(1, 32 * kConsumers);  // s.last is read before the next unit writes it
    if (!last) continue;
    __threadfence();
    float sum[2][4] = {};
    for (int seg = 0; seg < p.splits; ++seg)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int m = g + 8 * h;
            const int64_t n = n0 + 8 * nt + 2 * t + e;
            if (m < p.m && n < p.n) sum[nt][2 * h + e] += __ldcg(&p.partial[(int64_t(seg) * p.m + m) * p.n + n]);
          }
    store_unit(epi, buf, sum, p, n0, lane);
  }
}

template <class T, class OutT>
__global__ void __launch_bounds__(kThreads, 1) gemv_kernel(const Args p, const __grid_constant__ Epilogue<OutT> epi) {
  extern __shared__ unsigned char smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const int warp = threadIdx.x / 32;
  // A's rows past M, in every stage: zeros the copies never overwrite.
  for (int i = threadIdx.x; i < kStages * (kMaxM - p.m) * kPitch / 16; i += blockDim.x) {
    const int per = (kMaxM - p.m) * kPitch / 16;
    reinterpret_cast<uint4*>(s.stage[i / per].a + p.m * kPitch)[i % per] = make_uint4(0, 0, 0, 0);
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      tile::BulkBarrier{&s.full[i]}.init(1);
      tile::BulkBarrier{&s.empty[i]}.init(kConsumers);
    }
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  const int64_t units = int64_t(p.blocks) * p.splits;
  if (warp == kConsumers) produce<T>(s, p, units);
  else consume<T, OutT>(s, p, epi, units, warp);
}

// The split of K: among the segment lengths that leave at least 2 stages a segment, the one with
// the fewest stages on the busiest SM (units dealt round-robin to `sms` CTAs), the fewest splits
// of those.
inline void plan(Args& p, int sms) {
  p.blocks = int((p.n + kBlockRows - 1) / kBlockRows);
  p.k_stages = int(p.k / kStageK);
  int64_t best = INT64_MAX;
  for (int seg = p.k_stages; seg >= 1; --seg) {
    const int splits = (p.k_stages + seg - 1) / seg;
    if (splits > 1 && seg < 2) break;
    const int64_t units = int64_t(p.blocks) * splits;
    const int64_t busiest = (units + sms - 1) / sms * seg;
    if (busiest < best) best = busiest, p.splits = splits, p.seg_stages = seg;
  }
}

inline std::size_t smem_bytes() { return sizeof(Smem); }

}  // namespace tessera::matrix::gemv
