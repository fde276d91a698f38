// The Hopper backward's kernel: FlashAttention's backward, warp-specialized, on TMA and wgmma.
// Its host side (when the tier applies, the grid, the launch between the row-wise passes) is
// attention_backward_sm90.cu, the one file that includes this: it instantiates the kernel.
//
// Per 64 queries x 128 keys, five products of the same size: S = Q K^T, dP = dO V^T (to recompute
// P = exp(S - lse) and form dS = P (dP - delta)), dV += P^T dO, dK += dS^T Q and dQ += dS K. A
// CTA owns 128 keys of one key/value head and walks the query tiles that see them (over every
// query head of its group), so dK and dV stay in registers and are written once; dQ is summed
// across CTAs in float32 by the copy engine (bulk reduce-add) and converted afterwards.
//
// Roles (384 threads, 3 warpgroups):
//   warpgroup 0    the producer: one thread loads K and V once, then per step the query tile's Q,
//                  dO, lse and delta into a ring of stages; one thread of its second warp adds
//                  each step's dQ into the float32 sum (bulk reduce-add from shared memory)
//   warpgroups 1,2 consumers of 64 keys each. They compute the transposes, S^T = K Q^T and
//                  dP^T = V dO^T (keys are the rows, so P^T and dS^T sit in registers as the A
//                  operands of dV and dK), then put dS^T in shared memory, the A operand of dQ
//                  (how the two share dQ's product: Shape).
// Before: delta = rowsum(dO * O) and lse in log2 units, padded per 64-query tile; after: dQ from
// float32 to the output dtype, times the scale. ALiBi's bias enters P's recomputation only (it has
// no gradient): a template parameter, as the soft-cap, so that calls without it pay nothing.
#pragma once

#include <cuda.h>
#include <cuda/atomic>

#include <cmath>
#include <cstdint>

#include "ops/attention/attention.cuh"
#include "ops/attention/attention_backward_sm90.cuh"
#include "ops/attention/attention_sm90.cuh"
#include "tile/activation.cuh"
#include "tile/bulk.cuh"
#include "tile/smem.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/wgmma.cuh"

namespace tessera::attn::sm90_bwd {

using sm90::col_of;
using sm90::kLog2e;
using sm90::row_of;

constexpr int kThreads = 384;
constexpr int kDsBar = 1;   // both consumers' dS^T in shared memory
constexpr int kEpiBar = 2;  // 2, 3: a consumer's staging of dK and dV
constexpr int kTurnBar = 4; // 4, 5: split-K, consumer 0's and 1's turn to issue S and dP

// Operand tiles are [chunk][rows][64] in the copy engine's 128-byte swizzle, 1024-byte aligned.
template <class T, class C>
struct alignas(1024) Smem {
  T k[C::kChunks][kBN * 64];
  T v[C::kChunks][kBN * 64];
  T q[C::kStages][C::kChunks][kBM * 64];
  T dout[C::kStages][C::kChunks][kBM * 64];
  T ds[2][kBN * kBM];             // dS^T of a step, [key][query]: dQ's A operand, MN-major
  float dq[2][kBM * C::kCols];    // each consumer's dQ product, in accumulator order
  float lse[C::kStages][kBM], delta[C::kStages][kBM];
  uint64_t kv_full, q_full[C::kStages], q_empty[C::kStages], dq_full[2], dq_empty[2];
};

struct Bwd {
  void *dk, *dv;
  Strides sdk, sdv;
  float* dq_acc;             // [batch * heads_q][m_blocks][kParts][kBM * kCols], accumulator order
  int* order;  // deterministic dq (else null): additions done, [batch * heads_q][m_blocks][kParts]
  const float *lse2, *delta;  // [batch * heads_q][m_blocks * kBM]; padding rows +inf and 0
  int64_t m_blocks, seq_q, seq_k;
  const int32_t *cu_q, *cu_k;
  int group, band;  // band: (head, sequence) pairs per band of the grid (tile_slowest)
  int split;        // CTAs per key tile, each over group / split of the query heads (split_of)
  int64_t part_stride;  // split > 1: floats between the parts' dK (and dV) in dk, dv (float32)
  float scale, mul, softcap;  // mul: what takes a (capped) score to log2 units
  bool causal;
  int64_t window_left, window_right;
  const float* alibi;  // ALiBi (the kernel's Alibi): slope of (b, h) at b * alibi_b + h * alibi_h
  int64_t alibi_b, alibi_h;
};

// A CTA's share: a key tile (keys key0 .. key0 + kBN - 1) of head hk of sequence b, and the n_m
// query tiles from m_first of each query head of the group that see any of them.
struct Work {
  int hk, part, b, tb;
  int64_t q0, k0, len_q, len_k, key0;
  int m_first, n_m, steps;
};

// The query tiles [first, last] that see any of the keys key0 .. key0 + kBN - 1 (none: last <
// first). Both ends grow with key0.
struct Tiles {
  int first, last;
};
__device__ Tiles tiles_of(int64_t key0, int64_t len_q, int64_t len_k, const Bwd& f) {
  if (key0 >= len_k) return {0, -1};
  const int64_t key_last = min(key0 + kBN, len_k) - 1;
  const KeyRange a = query_range(key0, len_q, len_k, f.causal, f.window_left, f.window_right);
  const KeyRange z = query_range(key_last, len_q, len_k, f.causal, f.window_left, f.window_right);
  if (z.hi < a.lo) return {0, -1};
  return {int(a.lo / kBM), int(z.hi / kBM)};
}

__device__ Work work_of(const Bwd& f) {
  Work w;
  // Deterministic: the key tiles from the last (rank_of), so that a CTA waits only on CTAs that
  // were dispatched before it, never on one that cannot start until it finishes. Otherwise the
  // first key tiles of every head first: under a causal mask they see the most query tiles.
  const sm90::GridPos g = f.order ? sm90::GridPos{int(gridDim.x - 1 - blockIdx.x), int(blockIdx.y), int(blockIdx.z)}
                                  : sm90::tile_slowest(f.band);
  w.hk = g.y / f.split, w.part = g.y % f.split, w.b = g.z, w.key0 = int64_t(g.x) * kBN;
  if (f.cu_q) {
    w.q0 = f.cu_q[w.b], w.k0 = f.cu_k[w.b], w.tb = 0;
    w.len_q = f.cu_q[w.b + 1] - w.q0, w.len_k = f.cu_k[w.b + 1] - w.k0;
  } else {
    w.q0 = w.k0 = 0, w.tb = w.b, w.len_q = f.seq_q, w.len_k = f.seq_k;
  }
  const Tiles t = tiles_of(w.key0, w.len_q, w.len_k, f);
  w.m_first = t.first, w.n_m = t.last - t.first + 1;
  w.steps = w.n_m * (f.group / f.split);
  return w;
}

// Deterministic dq: the key tiles that add into query tile m are a contiguous run of this
// sequence's (both ends of tiles_of grow with the keys), added from the last to the first: under
// a causal mask key tile n reaches query tile m after fewer steps than tile n - 1 does, so that
// order keeps the CTAs from waiting on each other. The run ends at the last key that tile m's last
// query sees: none after i + seq_k - seq_q (plus window_right) for query i, where bounded. Not
// inlined: it runs in the producer warpgroup, whose few registers the loop around it needs.
__device__ __noinline__ int rank_of(int m, const Work& w, const Bwd& f) {
  int64_t last = w.len_k - 1;
  if (f.causal || f.window_right >= 0) {
    const int64_t right = f.causal ? int64_t(0) : f.window_right;  // causal caps the window at 0
    last = min(last, int64_t(m) * kBM + kBM - 1 + (w.len_k - w.len_q) + right);
  }
  return int(last / kBN) - int(w.key0 / kBN);
}

// Step `it` of a CTA: query head h (of the group), query tile m.
struct Step {
  int h, m;
};
__device__ __forceinline__ Step step_of(const Work& w, const Bwd& f, int it) {
  return {w.hk * f.group + w.part * (f.group / f.split) + it / w.n_m, w.m_first + it % w.n_m};
}
__device__ __forceinline__ int64_t head_of(const Work& w, const Bwd& f, int h) {  // b * heads_q + h
  return int64_t(w.b) * (gridDim.y / f.split) * f.group + h;
}

template <class T, class C>
__device__ void produce(Smem<T, C>& s, const Bwd& f, const CUtensorMap* mq, const CUtensorMap* mk,
                        const CUtensorMap* mv, const CUtensorMap* mdo, const Work& w) {
  constexpr uint32_t kRowBytes = C::D * sizeof(T);
  if (w.steps == 0) return;
  const tile::BulkBarrier kv{&s.kv_full};
  kv.expect(2 * kBN * kRowBytes);
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) {
    tile::tma_load(s.k[c], mk, 64 * c, int(w.k0 + w.key0), w.hk, w.tb, kv);
    tile::tma_load(s.v[c], mv, 64 * c, int(w.k0 + w.key0), w.hk, w.tb, kv);
  }
  for (int it = 0; it < w.steps; ++it) {
    const int st = it % C::kStages;
    const auto [h, m] = step_of(w, f, it);
    const tile::BulkBarrier full{&s.q_full[st]}, empty{&s.q_empty[st]};
    empty.wait((uint32_t(it / C::kStages) & 1) ^ 1);  // a fresh barrier's preceding phase counts as complete
    full.expect(2 * kBM * kRowBytes + 2 * kBM * sizeof(float));
    const int row = int(w.q0) + m * kBM;
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) {
      tile::tma_load(s.q[st][c], mq, 64 * c, row, h, w.tb, full);
      tile::tma_load(s.dout[st][c], mdo, 64 * c, row, h, w.tb, full);
    }
    const int64_t stat = (head_of(w, f, h) * f.m_blocks + m) * kBM;
    full.copy(s.lse[st], f.lse2 + stat, kBM * sizeof(float));
    full.copy(s.delta[st], f.delta + stat, kBM * sizeof(float));
  }
}

// acc = A B^T over head_dim for the warpgroup's 64 keys (A: K or V) against the step's 64 queries
// (B: Q or dO), both K-major.
template <class T, class C>
__device__ __forceinline__ void issue_keys_by_queries(const T* a, const T* b, int wg, float (&acc)[kBM / 2]) {
  using Mma = tile::wgmma::Mma<T, kBM, 0, 0>;
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk) {
    const int c = kk / 4, off = 2 * (kk % 4);
    Mma::run(acc, tile::wgmma::kmajor_sw128(a + c * kBN * 64 + wg * 64 * 64) + off,
             tile::wgmma::kmajor_sw128(b + c * kBM * 64) + off, kk > 0);
  }
}

// acc += X^T B for X^T in registers (keys by queries) and B the step's [query][head_dim] tile.
template <class T, class C>
__device__ __forceinline__ void issue_keys_by_dim(const uint32_t (&x)[kBM / 16][4], const T* b, float (&acc)[C::D / 2]) {
  using Mma = tile::wgmma::MmaRS<T, C::D, 1>;
#pragma unroll
  for (int kk = 0; kk < kBM / 16; ++kk)
    Mma::run(acc, x[kk], tile::wgmma::mnmajor_sw128(b, kBM * 128) + 128 * kk, true);
}

// The consumer's dQ product (Shape): dS^T and K both [key][...] in shared memory, MN-major.
template <class T, class C>
__device__ __forceinline__ void issue_dq(Smem<T, C>& s, int buf, int wg, float (&dq)[C::kCols / 2]) {
  using Mma = tile::wgmma::Mma<T, C::kCols, 1, 1>;
  constexpr int kKeys = C::kSplitK ? 64 : kBN;
  const int key0 = C::kSplitK ? wg * 64 : 0, col = C::kSplitK ? 0 : wg * C::kCols;
  const T* kh = &s.k[col / 64][key0 * 64 + col % 64];
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk)
    Mma::run(dq, tile::wgmma::mnmajor_sw128(&s.ds[buf][key0 * 64], kBN * 128) + 128 * kk,
             tile::wgmma::mnmajor_sw128(kh, kBN * 128) + 128 * kk, kk > 0);
}

// ALiBi over a step's tile in log2 units (those of x * mul, with or without the soft-cap): each
// of the thread's two keys lies on the diagonal of query kd = key - len_k + len_q.
__device__ __forceinline__ sm90::TileBias step_bias(const Bwd& f, const Work& w, Step st, int wg) {
  const int tid = threadIdx.x % 128;
  const int kd0 = int(w.key0 - (w.len_k - w.len_q)) + wg * 64 + (tid / 32) * 16 + (tid % 32) / 4;
  const int kd[2] = {kd0, kd0 + 8};
  return sm90::tile_bias(f.alibi[w.b * f.alibi_b + st.h * f.alibi_h] * kLog2e, st.m * kBM, kd, tid % 32);
}

// P^T from S^T in place, zero outside the keys' query ranges [lo, hi] (relative to the step's
// first query; branch-free, so that the loop has one body, small enough for the instruction
// cache). Cap: the soft-cap; Alibi: ALiBi's bias.
template <bool Cap, bool Alibi>
__device__ __forceinline__ void probabilities(float (&p)[kBM / 2], const Bwd& f, const float* lse2, const int (&lo)[2],
                                              const int (&hi)[2], const sm90::TileBias& bias, int lane) {
#pragma unroll
  for (int j = 0; j < kBM / 2; ++j) {
    const int col = col_of(j, lane);
    const float x = Cap ? f.softcap * tanhf(p[j] * f.scale / f.softcap) : p[j];
    float y = fmaf(x, f.mul, -lse2[col]);
    if constexpr (Alibi) y += bias.at(j);
    const float e = tile::ex2_approx(y);
    p[j] = col < lo[row_of(j)] || col > hi[row_of(j)] ? 0.f : e;
  }
}

// dS^T = P^T (dP^T - delta) in place of dP^T, times the soft-cap's derivative 1 - tanh^2,
// recovered from P itself (where P = 0, dS = 0; ALiBi's bias taken back out) to keep the registers
// of a second tile free.
template <bool Cap, bool Alibi>
__device__ __forceinline__ void scores_grad(float (&dp)[kBM / 2], const float (&p)[kBM / 2], const Bwd& f,
                                            const float* lse2, const float* delta, const sm90::TileBias& bias,
                                            int lane) {
#pragma unroll
  for (int j = 0; j < kBM / 2; ++j) {
    const int col = col_of(j, lane);
    float g = p[j] * (dp[j] - delta[col]);
    if (Cap) {
      float x = __log2f(p[j]) + lse2[col];  // the (biased) capped score times mul
      if constexpr (Alibi) x -= bias.at(j);
      const float t = p[j] > 0.f ? x / (f.mul * f.softcap) : 0.f;
      g *= 1.f - t * t;
    }
    dp[j] = g;
  }
}

// dS^T into shared memory as dQ's A operand: [key][query], 128-byte rows swizzled as the copy
// engine would.
template <class T>
__device__ __forceinline__ void stage_ds(T* ds, const float (&g)[kBM / 2], int wg, int tid) {
  const int warp = tid / 32, lane = tid % 32;
#pragma unroll
  for (int j = 0; j < kBM / 2; j += 2) {
    const int col = col_of(j, lane), row = wg * 64 + warp * 16 + lane / 4 + 8 * row_of(j);
    *reinterpret_cast<uint32_t*>(&ds[row * 64 + (((col / 8) ^ (row % 8)) * 8) + col % 8]) =
        sm90::pack2<T>(g[j], g[j + 1]);
  }
}

// The consumer's dQ product, staged in accumulator order (16 bytes a thread, no bank conflicts)
// for the producer warpgroup's second warp to add into dq_acc (add_dq), once the previous step's
// addition has read the buffer.
template <class T, class C>
__device__ __forceinline__ void stage_dq(Smem<T, C>& s, const float (&dq)[C::kCols / 2], int it, int wg, int tid) {
  tile::BulkBarrier{&s.dq_empty[wg]}.wait((uint32_t(it) & 1) ^ 1);
  float4* buf = reinterpret_cast<float4*>(s.dq[wg]);
#pragma unroll
  for (int j4 = 0; j4 < C::kCols / 8; ++j4)
    buf[j4 * 128 + tid] = make_float4(dq[4 * j4], dq[4 * j4 + 1], dq[4 * j4 + 2], dq[4 * j4 + 3]);
  tile::fence_async_shared();
  tile::BulkBarrier{&s.dq_full[wg]}.arrive();
}

// One thread: each step's two dQ products added into dq_acc by the copy engine (bulk reduce-add);
// a buffer is handed back once the copy engine has read it. Deterministic: each addition waits
// for its turn among the CTAs that add into the same tile, and completes before passing it on.
template <class T, class C>
__device__ void add_dq(Smem<T, C>& s, const Bwd& f, const Work& w) {
  for (int it = 0; it < w.steps; ++it) {
    const auto [h, m] = step_of(w, f, it);
    const int rank = f.order ? rank_of(m, w, f) : 0;
#pragma unroll
    for (int wg = 0; wg < 2; ++wg) {
      // Split-K: both consumers add into the one tile, consumer 0 first.
      const int part = C::kSplitK ? 0 : wg, turn_of_mine = C::kSplitK ? 2 * rank + wg : rank;
      const int64_t tile = (head_of(w, f, h) * f.m_blocks + m) * C::kParts + part;
      tile::BulkBarrier{&s.dq_full[wg]}.wait(uint32_t(it) & 1);
      if (f.order) {
        cuda::atomic_ref<int, cuda::thread_scope_device> turn(f.order[tile]);
        while (turn.load(cuda::memory_order_acquire) != turn_of_mine) {
        }
        tile::fence_async_global();
      }
      tile::bulk_reduce_add(f.dq_acc + tile * (kBM * C::kCols), s.dq[wg], kBM * C::kCols * sizeof(float));
      tile::bulk_commit();
      if (f.order) {
        tile::bulk_wait<0>();
        tile::fence_async_global();
        cuda::atomic_ref<int, cuda::thread_scope_device>(f.order[tile]).fetch_add(1, cuda::memory_order_release);
      }
      tile::bulk_wait_read<0>();
      tile::BulkBarrier{&s.dq_empty[wg]}.arrive();
    }
  }
}

// The query ranges [lo, hi] of the thread's two keys (its rows of the consumer's 64), and each
// step's view of them: relative to the step's first query, clamped to [-1, kBM]. (int: the
// launcher keeps lengths under 2^30.)
__device__ __forceinline__ void key_ranges(const Work& w, const Bwd& f, int wg, int (&lo)[2], int (&hi)[2]) {
  const int tid = threadIdx.x % 128;
  const int64_t key = w.key0 + wg * 64 + (tid / 32) * 16 + (tid % 32) / 4;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const KeyRange qr = query_range(key + 8 * r, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
    lo[r] = int(qr.lo), hi[r] = int(qr.hi);
  }
}
__device__ __forceinline__ void step_ranges(const int (&lo)[2], const int (&hi)[2], int m, int (&rlo)[2],
                                            int (&rhi)[2]) {
  const int q_base = m * kBM;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    rlo[r] = min(max(lo[r] - q_base, -1), kBM);
    rhi[r] = min(max(hi[r] - q_base, -1), kBM);
  }
}

// Writes the consumer's dK (times the scale) and dV, staged through its own rows of K and V:
// both consumers must be past their last multiply.
template <class T, class C>
__device__ void store_dkdv(Smem<T, C>& s, const Bwd& f, const Work& w, const float (&dk)[C::D / 2],
                           const float (&dv)[C::D / 2], int wg) {
  const int64_t row0 = w.k0 + w.key0 + wg * 64, valid = w.len_k - w.key0 - wg * 64;
  if (f.split > 1) {  // a part, in float32 straight from the accumulators (only small grids split)
    const int lane = threadIdx.x % 32, r0 = (threadIdx.x % 128) / 32 * 16 + lane / 4;
    float* pk = static_cast<float*>(f.dk) + w.part * f.part_stride + w.b * f.sdk.b + w.hk * f.sdk.h + row0 * f.sdk.s;
    float* pv = static_cast<float*>(f.dv) + w.part * f.part_stride + w.b * f.sdv.b + w.hk * f.sdv.h + row0 * f.sdv.s;
#pragma unroll
    for (int j = 0; j < C::D / 2; j += 2) {
      const int row = r0 + 8 * sm90::row_of(j), col = sm90::col_of(j, lane);
      if (row >= valid) continue;
      *reinterpret_cast<float2*>(pk + row * f.sdk.s + col) = make_float2(dk[j] * f.scale, dk[j + 1] * f.scale);
      *reinterpret_cast<float2*>(pv + row * f.sdv.s + col) = make_float2(dv[j], dv[j + 1]);
    }
    return;
  }
  const float one[2] = {1.f, 1.f}, scale[2] = {f.scale, f.scale};
  T* dvp = static_cast<T*>(f.dv) + w.part * f.part_stride + w.b * f.sdv.b + w.hk * f.sdv.h + row0 * f.sdv.s;
  sm90::store_tile<T, C::D>(&s.v[0][0], kBN, wg * 64, dv, one, dvp, f.sdv.s, valid, kEpiBar + wg);
  T* dkp = static_cast<T*>(f.dk) + w.part * f.part_stride + w.b * f.sdk.b + w.hk * f.sdk.h + row0 * f.sdk.s;
  sm90::store_tile<T, C::D>(&s.k[0][0], kBN, wg * 64, dk, scale, dkp, f.sdk.s, valid, kEpiBar + wg);
}

template <class T, class C>
__device__ __forceinline__ void issue_scores(Smem<T, C>& s, int st, int wg, float (&p)[kBM / 2], float (&g)[kBM / 2]) {
  tile::wgmma::fence();
  issue_keys_by_queries<T, C>(&s.k[0][0], &s.q[st][0][0], wg, p);
  tile::wgmma::commit();
  issue_keys_by_queries<T, C>(&s.v[0][0], &s.dout[st][0][0], wg, g);
  tile::wgmma::commit();
}

// A consumer warpgroup, a step at a time. Split-N: the consumers meet each step to share dS^T.
// Split-K: they never meet, and take turns to issue S and dP (named barriers), so that the tensor
// cores run one's while the other computes P and dS, rather than both at once. (Issuing step
// it + 1's S and dP before step it's dQ is read would keep multiplies in flight across the loop's
// back edge, which ptxas serializes.)
template <class T, class C, bool Cap, bool Alibi>
__device__ void consume(Smem<T, C>& s, const Bwd& f, const Work& w, int wg) {
  const int tid = threadIdx.x % 128, lane = tid % 32;
  int lo[2], hi[2];
  key_ranges(w, f, wg, lo, hi);
  float dk[C::D / 2], dv[C::D / 2];
#pragma unroll
  for (int j = 0; j < C::D / 2; ++j) dk[j] = dv[j] = 0.f;
  if (w.steps > 0) tile::BulkBarrier{&s.kv_full}.wait(0);
  if (C::kSplitK && wg == 1 && w.steps > 0) tile::group_arrive(kTurnBar, 256);  // consumer 0 goes first
  for (int it = 0; it < w.steps; ++it) {
    const int st = it % C::kStages;
    const Step step = step_of(w, f, it);
    int rlo[2], rhi[2];
    step_ranges(lo, hi, step.m, rlo, rhi);
    const sm90::TileBias bias = Alibi ? step_bias(f, w, step, wg) : sm90::TileBias{};
    float p[kBM / 2], g[kBM / 2], dq[C::kCols / 2];
    uint32_t pa[kBM / 16][4], ga[kBM / 16][4];
    tile::BulkBarrier{&s.q_full[st]}.wait(uint32_t(it / C::kStages) & 1);
    if constexpr (C::kSplitK) tile::group_sync(kTurnBar + wg, 256);
    issue_scores(s, st, wg, p, g);
    if (C::kSplitK && (wg == 0 || it + 1 < w.steps)) tile::group_arrive(kTurnBar + 1 - wg, 256);
    tile::wgmma::wait<1>();
    tile::wgmma::fence_operands(p);
    probabilities<Cap, Alibi>(p, f, s.lse[st], rlo, rhi, bias, lane);
    sm90::pack_a<T, kBM>(p, pa);
    tile::wgmma::fence();
    issue_keys_by_dim<T, C>(pa, &s.dout[st][0][0], dv);
    tile::wgmma::commit();
    tile::wgmma::wait<1>();
    tile::wgmma::fence_operands(g);
    // ALiBi's bias rebuilt rather than held across the dV product: with the soft-cap, held it spills.
    scores_grad<Cap, Alibi>(g, p, f, s.lse[st], s.delta[st], Alibi ? step_bias(f, w, step, wg) : sm90::TileBias{},
                            lane);
    sm90::pack_a<T, kBM>(g, ga);
    stage_ds<T>(s.ds[it % 2], g, wg, tid);
    tile::wgmma::fence();
    issue_keys_by_dim<T, C>(ga, &s.q[st][0][0], dk);
    tile::wgmma::commit();
    tile::fence_async_shared();
    if constexpr (C::kSplitK) tile::group_sync(kEpiBar + wg, 128);
    else tile::group_sync(kDsBar, 256);
    issue_dq(s, it % 2, wg, dq);
    tile::wgmma::commit();
    tile::wgmma::wait<0>();
    tile::wgmma::fence_operands(dv);
    tile::wgmma::fence_operands(dk);
    tile::wgmma::fence_operands(dq);
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      tile::wgmma::fence_operands(pa[kk]);
      tile::wgmma::fence_operands(ga[kk]);
    }
    if (tid == 0) tile::BulkBarrier{&s.q_empty[st]}.arrive();
    stage_dq(s, dq, it, wg, tid);
  }
  tile::group_sync(kDsBar, 256);
  store_dkdv(s, f, w, dk, dv, wg);
}

template <class T, class C, bool Cap, bool Alibi>
__global__ void __launch_bounds__(kThreads, 1)
    attention_bwd_sm90_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                              const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mdo,
                              const Bwd f) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = tile::aligned_smem<Smem<T, C>, 1024>(smem_raw);
  const Work w = work_of(f);
  if (w.key0 >= w.len_k) return;  // a shorter sequence than the grid's longest
  if (threadIdx.x == 0) {
    tile::tma_prefetch(&mq);
    tile::tma_prefetch(&mk);
    tile::tma_prefetch(&mv);
    tile::tma_prefetch(&mdo);
    tile::BulkBarrier{&s.kv_full}.init(1);
    for (int i = 0; i < C::kStages; ++i) {
      tile::BulkBarrier{&s.q_full[i]}.init(1);
      tile::BulkBarrier{&s.q_empty[i]}.init(2);
    }
    for (int i = 0; i < 2; ++i) {
      tile::BulkBarrier{&s.dq_full[i]}.init(128);
      tile::BulkBarrier{&s.dq_empty[i]}.init(1);
    }
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    tile::wgmma::release_registers<24>();
    if (threadIdx.x == 0) produce(s, f, &mq, &mk, &mv, &mdo, w);
    if (threadIdx.x == 32) add_dq(s, f, w);
  } else {
    tile::wgmma::claim_registers<240>();
    consume<T, C, Cap, Alibi>(s, f, w, int(threadIdx.x / 128) - 1);
  }
}

}  // namespace tessera::attn::sm90_bwd
