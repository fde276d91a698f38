// The Hopper tier of attention_backward: FlashAttention's backward, warp-specialized, on TMA and
// wgmma.
//
// Per 64 queries x 128 keys, five products of the same size: S = Q K^T, dP = dO V^T (to recompute
// P = exp(S - lse) and form dS = P (dP - delta)), dV += P^T dO, dK += dS^T Q and dQ += dS K. A
// CTA owns 128 keys of one key/value head and walks the query tiles that see them (over every
// query head of its group), so dK and dV stay in registers and are written once; dQ is summed
// across CTAs in float32 by the copy engine (bulk reduce-add) and converted afterwards.
//
// Roles (384 threads, 3 warpgroups):
//   warpgroup 0    the producer: one thread loads K and V once, then per step the query tile's Q,
//                  dO, lse and delta into a ring of stages
//   warpgroups 1,2 consumers of 64 keys each. They compute the transposes, S^T = K Q^T and
//                  dP^T = V dO^T (keys are the rows, so P^T and dS^T sit in registers as the A
//                  operands of dV and dK), then meet to put dS^T in shared memory, from where each
//                  multiplies half of dQ's columns: dQ[:, half] = dS K[:, half].
// Before: delta = rowsum(dO * O) and lse in log2 units, padded per 64-query tile; after: dQ from
// float32 to the output dtype, times the scale.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "ops/attention/attention.cuh"
#include "ops/attention/attention_sm90.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tma.hpp"
#include "tile/activation.cuh"
#include "tile/bulk.cuh"
#include "tile/convert.cuh"
#include "tile/reduce.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/wgmma.cuh"

namespace tessera::attn {
namespace sm90_bwd {

using sm90::col_of;
using sm90::kLog2e;
using sm90::row_of;

constexpr int kBM = 64;   // queries per step
constexpr int kBN = 128;  // keys per CTA: 64 per consumer warpgroup
constexpr int kThreads = 384;
constexpr int kStages = 2;
constexpr int kDsBar = 1;   // both consumers' dS^T in shared memory
constexpr int kEpiBar = 2;  // 2, 3: a consumer's staging of dQ, dK, dV

template <int D_>
struct Shape {
  static constexpr int D = D_, kChunks = D / 64, kHalf = D / 2;
};

// Operand tiles are [chunk][rows][64] in the copy engine's 128-byte swizzle, 1024-byte aligned.
template <class T, class C>
struct alignas(1024) Smem {
  T k[C::kChunks][kBN * 64];
  T v[C::kChunks][kBN * 64];
  T q[kStages][C::kChunks][kBM * 64];
  T dout[kStages][C::kChunks][kBM * 64];
  T ds[2][kBN * kBM];             // dS^T of a step, [key][query]: dQ's A operand, MN-major
  float dq[2][kBM * C::kHalf];    // each consumer's half of dQ, in accumulator order
  float lse[kStages][kBM], delta[kStages][kBM];
  uint64_t kv_full, q_full[kStages], q_empty[kStages];
};

struct Bwd {
  void *dk, *dv;
  Strides sdk, sdv;
  float* dq_acc;             // [batch * heads_q][m_blocks][2 halves][kBM * D / 2], accumulator order
  const float *lse2, *delta;  // [batch * heads_q][m_blocks * kBM]; padding rows +inf and 0
  int64_t m_blocks, seq_q, seq_k;
  const int32_t *cu_q, *cu_k;
  int group;
  float scale, mul, softcap;  // mul: what takes a (capped) score to log2 units
  bool causal;
  int64_t window_left, window_right;
};

// A CTA's share: keys key0 .. key0 + kBN - 1 of head hk of sequence b, and the query tiles
// [m_first, m_last] of each query head of the group that see any of them. Tiles inside the
// query rows [full_lo, full_hi] see all the keys and need no mask.
struct Work {
  int hk, b, tb;
  int64_t q0, k0, len_q, len_k, key0;
  int m_first, n_m, steps;
  int64_t full_lo, full_hi;
};

__device__ Work work_of(const Bwd& f) {
  Work w;
  w.hk = int(blockIdx.y), w.b = int(blockIdx.z), w.key0 = int64_t(blockIdx.x) * kBN;
  if (f.cu_q) {
    w.q0 = f.cu_q[w.b], w.k0 = f.cu_k[w.b], w.tb = 0;
    w.len_q = f.cu_q[w.b + 1] - w.q0, w.len_k = f.cu_k[w.b + 1] - w.k0;
  } else {
    w.q0 = w.k0 = 0, w.tb = w.b, w.len_q = f.seq_q, w.len_k = f.seq_k;
  }
  w.m_first = 0, w.n_m = 0, w.steps = 0, w.full_lo = 0, w.full_hi = -1;
  if (w.key0 >= w.len_k) return w;
  const int64_t key_last = min(w.key0 + kBN, w.len_k) - 1;
  const KeyRange a = query_range(w.key0, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
  const KeyRange z = query_range(key_last, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
  if (z.hi < a.lo) return w;
  w.m_first = int(a.lo / kBM);
  w.n_m = int(z.hi / kBM) - w.m_first + 1;
  w.steps = w.n_m * f.group;
  if (w.key0 + kBN <= w.len_k) w.full_lo = z.lo, w.full_hi = a.hi;
  return w;
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
    const int st = it % kStages, h = w.hk * f.group + it / w.n_m, m = w.m_first + it % w.n_m;
    const tile::BulkBarrier full{&s.q_full[st]}, empty{&s.q_empty[st]};
    empty.wait((uint32_t(it / kStages) & 1) ^ 1);  // a fresh barrier's preceding phase counts as complete
    full.expect(2 * kBM * kRowBytes + 2 * kBM * sizeof(float));
    const int row = int(w.q0) + m * kBM;
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) {
      tile::tma_load(s.q[st][c], mq, 64 * c, row, h, w.tb, full);
      tile::tma_load(s.dout[st][c], mdo, 64 * c, row, h, w.tb, full);
    }
    const int64_t stat = ((int64_t(w.b) * gridDim.y * f.group + h) * f.m_blocks + m) * kBM;
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

// dQ[:, half wg] = dS K[:, half wg]: dS^T and K both [key][...] in shared memory, MN-major.
template <class T, class C>
__device__ __forceinline__ void issue_dq(Smem<T, C>& s, int buf, int wg, float (&dq)[C::kHalf / 2]) {
  using Mma = tile::wgmma::Mma<T, C::kHalf, 1, 1>;
  const int col = wg * C::kHalf;
  const T* kh = &s.k[col / 64][col % 64];
#pragma unroll
  for (int kk = 0; kk < kBN / 16; ++kk)
    Mma::run(dq, tile::wgmma::mnmajor_sw128(&s.ds[buf][0], kBN * 128) + 128 * kk,
             tile::wgmma::mnmajor_sw128(kh, kBN * 128) + 128 * kk, kk > 0);
}

// P^T from S^T in place, and each element's factor for dS (the soft-cap's derivative, 1 - tanh^2,
// recovered from P itself to keep the registers of a second tile free: where P = 0, dS = 0).
template <class C>
__device__ __forceinline__ void probabilities(float (&p)[kBM / 2], const Bwd& f, const float* lse2, int64_t q_base,
                                              bool masked, const int64_t (&lo)[2], const int64_t (&hi)[2], int lane) {
#pragma unroll
  for (int j = 0; j < kBM / 2; ++j) {
    const int col = col_of(j, lane);
    const float x = f.softcap > 0.f ? f.softcap * tanhf(p[j] * f.scale / f.softcap) : p[j];
    p[j] = tile::ex2_approx(fmaf(x, f.mul, -lse2[col]));
    if (masked && (q_base + col < lo[row_of(j)] || q_base + col > hi[row_of(j)])) p[j] = 0.f;
  }
}

__device__ __forceinline__ void scores_grad(float (&dp)[kBM / 2], const float (&p)[kBM / 2], const Bwd& f,
                                            const float* lse2, const float* delta, int lane) {
#pragma unroll
  for (int j = 0; j < kBM / 2; ++j) {
    const int col = col_of(j, lane);
    float g = p[j] * (dp[j] - delta[col]);
    if (f.softcap > 0.f) {
      const float t = p[j] > 0.f ? (__log2f(p[j]) + lse2[col]) / (f.mul * f.softcap) : 0.f;
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

// The warpgroup's half of dQ: staged in accumulator order (16 bytes a thread, no bank conflicts),
// then added into dq_acc by the copy engine. The previous step's addition must have read the
// staging buffer first.
template <class T, class C>
__device__ __forceinline__ void add_dq(Smem<T, C>& s, const float (&dq)[C::kHalf / 2], float* dst, int wg, int tid) {
  if (tid == 0) tile::bulk_wait_read<0>();
  tile::group_sync(kEpiBar + wg, 128);
  float4* buf = reinterpret_cast<float4*>(s.dq[wg]);
#pragma unroll
  for (int j4 = 0; j4 < C::kHalf / 8; ++j4)
    buf[j4 * 128 + tid] = make_float4(dq[4 * j4], dq[4 * j4 + 1], dq[4 * j4 + 2], dq[4 * j4 + 3]);
  tile::fence_async_shared();
  tile::group_sync(kEpiBar + wg, 128);
  if (tid == 0) {
    tile::bulk_reduce_add(dst, s.dq[wg], kBM * C::kHalf * sizeof(float));
    tile::bulk_commit();
  }
}

template <class T, class C>
__device__ void consume(Smem<T, C>& s, const Bwd& f, const Work& w, int wg) {
  const int tid = threadIdx.x % 128, lane = tid % 32;
  const int64_t key = w.key0 + wg * 64 + (tid / 32) * 16 + lane / 4;
  int64_t lo[2], hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const KeyRange qr = query_range(key + 8 * r, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
    lo[r] = qr.lo, hi[r] = qr.hi;
  }
  float dk[C::D / 2], dv[C::D / 2];
#pragma unroll
  for (int j = 0; j < C::D / 2; ++j) dk[j] = dv[j] = 0.f;
  if (w.steps > 0) tile::BulkBarrier{&s.kv_full}.wait(0);
  for (int it = 0; it < w.steps; ++it) {
    const int st = it % kStages, h = w.hk * f.group + it / w.n_m, m = w.m_first + it % w.n_m;
    const int64_t q_base = int64_t(m) * kBM;
    const bool masked = q_base < w.full_lo || q_base + kBM - 1 > w.full_hi;
    float p[kBM / 2], g[kBM / 2], dq[C::kHalf / 2];
    uint32_t pa[kBM / 16][4], ga[kBM / 16][4];
    tile::BulkBarrier{&s.q_full[st]}.wait(uint32_t(it / kStages) & 1);
    tile::wgmma::fence();
    issue_keys_by_queries<T, C>(&s.k[0][0], &s.q[st][0][0], wg, p);
    tile::wgmma::commit();
    issue_keys_by_queries<T, C>(&s.v[0][0], &s.dout[st][0][0], wg, g);
    tile::wgmma::commit();
    tile::wgmma::wait<1>();
    tile::wgmma::fence_operands(p);
    probabilities<C>(p, f, s.lse[st], q_base, masked, lo, hi, lane);
    sm90::pack_a<T, kBM>(p, pa);
    tile::wgmma::fence();
    issue_keys_by_dim<T, C>(pa, &s.dout[st][0][0], dv);
    tile::wgmma::commit();
    tile::wgmma::wait<1>();
    tile::wgmma::fence_operands(g);
    scores_grad(g, p, f, s.lse[st], s.delta[st], lane);
    sm90::pack_a<T, kBM>(g, ga);
    stage_ds<T>(s.ds[it % 2], g, wg, tid);
    tile::wgmma::fence();
    issue_keys_by_dim<T, C>(ga, &s.q[st][0][0], dk);
    tile::wgmma::commit();
    tile::fence_async_shared();
    tile::group_sync(kDsBar, 256);
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
    const int64_t bh = int64_t(w.b) * gridDim.y * f.group + h;
    add_dq(s, dq, f.dq_acc + ((bh * f.m_blocks + m) * 2 + wg) * (kBM * C::kHalf), wg, tid);
  }
  // Both consumers are past their last multiply: K and V may be overwritten with dK and dV.
  tile::group_sync(kDsBar, 256);
  const int64_t row0 = w.k0 + w.key0 + wg * 64, valid = w.len_k - w.key0 - wg * 64;
  const float one[2] = {1.f, 1.f}, scale[2] = {f.scale, f.scale};
  T* dvp = static_cast<T*>(f.dv) + w.b * f.sdv.b + w.hk * f.sdv.h + row0 * f.sdv.s;
  sm90::store_tile<T, C::D>(&s.v[0][0], kBN, wg * 64, dv, one, dvp, f.sdv.s, valid, kEpiBar + wg);
  T* dkp = static_cast<T*>(f.dk) + w.b * f.sdk.b + w.hk * f.sdk.h + row0 * f.sdk.s;
  sm90::store_tile<T, C::D>(&s.k[0][0], kBN, wg * 64, dk, scale, dkp, f.sdk.s, valid, kEpiBar + wg);
  if (tid == 0) tile::bulk_wait_read<0>();
}

template <class T, class C>
__global__ void __launch_bounds__(kThreads, 1)
    attention_bwd_sm90_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                              const __grid_constant__ CUtensorMap mv, const __grid_constant__ CUtensorMap mdo,
                              const Bwd f) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = *reinterpret_cast<Smem<T, C>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const Work w = work_of(f);
  if (w.key0 >= w.len_k) return;  // a shorter sequence than the grid's longest
  if (threadIdx.x == 0) {
    tile::tma_prefetch(&mq);
    tile::tma_prefetch(&mk);
    tile::tma_prefetch(&mv);
    tile::tma_prefetch(&mdo);
    tile::BulkBarrier{&s.kv_full}.init(1);
    for (int i = 0; i < kStages; ++i) {
      tile::BulkBarrier{&s.q_full[i]}.init(1);
      tile::BulkBarrier{&s.q_empty[i]}.init(2);
    }
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    tile::wgmma::release_registers<24>();
    if (threadIdx.x == 0) produce(s, f, &mq, &mk, &mv, &mdo, w);
  } else {
    tile::wgmma::claim_registers<240>();
    consume(s, f, w, int(threadIdx.x / 128) - 1);
  }
}

// delta = rowsum(dO * O) and lse in log2 units, a warp per row of the padded [batch * heads_q]
// [m_blocks * kBM] layout; padding rows and rows that saw no key get lse2 = +inf (P = 0).
template <class T>
__global__ void __launch_bounds__(256) prepare_kernel(Params p, const void* dout, Strides sdo, const float* lse,
                                                      float* lse2, float* delta, int64_t rows_per_head) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (row >= p.batch * p.heads_q * rows_per_head) return;
  const int64_t i = row % rows_per_head, bh = row / rows_per_head, h = bh % p.heads_q, b = bh / p.heads_q;
  const Seq sq = seq_of(p, b);
  float d = 0.f, l = INFINITY;
  if (i < sq.len_q) {
    const T* o = static_cast<const T*>(p.out) + b * p.so.b + (sq.q0 + i) * p.so.s + h * p.so.h;
    const T* g = static_cast<const T*>(dout) + b * sdo.b + (sq.q0 + i) * sdo.s + h * sdo.h;
    for (int64_t c = lane; c < p.dim_v; c += 32) d += tile::to_float(o[c * p.so.d]) * tile::to_float(g[c * sdo.d]);
    d = tile::warp_sum(d);
    l = lse[b * p.lse_b + h * p.lse_h + sq.q0 + i] * kLog2e;
  }
  if (lane == 0) lse2[row] = l, delta[row] = d;
}

// dq = scale * dq_acc, from the accumulator order of add_dq: in a half of D / 2 columns, element
// (r, c) was thread 32 (r / 16) + 4 (r % 8) + (c % 8) / 2's value j = 4 (c / 8) + 2 ((r % 16) / 8)
// + c % 2, at float (j / 4) * 512 + thread * 4 + j % 4. Two columns a thread.
template <class T, int D>
__global__ void __launch_bounds__(256) finish_dq_kernel(Params p, const float* dq_acc, void* dq, Strides sdq,
                                                        int64_t m_blocks) {
  constexpr int kHalf = D / 2;
  const int64_t idx = int64_t(blockIdx.x) * 256 + threadIdx.x, pairs = D / 2;
  const int64_t rows_per_head = m_blocks * kBM;
  if (idx >= p.batch * p.heads_q * rows_per_head * pairs) return;
  const int c = int(idx % pairs) * 2;
  const int64_t row = idx / pairs, i = row % rows_per_head, bh = row / rows_per_head;
  const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
  const Seq sq = seq_of(p, b);
  if (i >= sq.len_q) return;
  const int r = int(i % kBM), half = c / kHalf, hc = c % kHalf;
  const int thread = 32 * (r / 16) + 4 * (r % 8) + (hc % 8) / 2, j = 4 * (hc / 8) + 2 * ((r % 16) / 8);
  const float* src = dq_acc + ((bh * m_blocks + i / kBM) * 2 + half) * (kBM * kHalf) + (j / 4) * 512 + thread * 4 + j % 4;
  const float2 v = *reinterpret_cast<const float2*>(src);
  T* out = static_cast<T*>(dq) + b * sdq.b + (sq.q0 + i) * sdq.s + h * sdq.h;
  out[c * sdq.d] = tile::from_float<T>(v.x * p.scale);
  out[(c + 1) * sdq.d] = tile::from_float<T>(v.y * p.scale);
}

template <class T, class C>
const void* kernel_of() {
  return reinterpret_cast<const void*>(attention_bwd_sm90_kernel<T, C>);
}

struct Maps {
  runtime::TmaShape q, k, v, dout;
};

Maps maps_of(const Params& p, const Strides& sdo) {
  const int64_t heads_kv = p.heads_q / p.group, batch = p.cu_q ? 1 : p.batch;
  const int64_t rows_q = p.cu_q ? p.total_q : p.seq_q, rows_k = p.cu_q ? p.total_k : p.seq_k;
  return {sm90::shape_of(p.sq, batch, rows_q, p.heads_q, p.dim, kBM),
          sm90::shape_of(p.sk, batch, rows_k, heads_kv, p.dim, kBN),
          sm90::shape_of(p.sv, batch, rows_k, heads_kv, p.dim, kBN),
          sm90::shape_of(sdo, batch, rows_q, p.heads_q, p.dim, kBM)};
}

template <class T, int D>
void launch_typed(const Params& p, const BackwardArgs& a, cudaStream_t stream) {
  using C = Shape<D>;
  const Maps mp = maps_of(p, a.sdo);
  const char* op = "attention_backward";
  const CUtensorMap mq = runtime::tma_map(op, p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128);
  const CUtensorMap mk = runtime::tma_map(op, p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128);
  const CUtensorMap mv = runtime::tma_map(op, p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128);
  const CUtensorMap mdo = runtime::tma_map(op, p.dtype, a.dout, mp.dout, runtime::TmaSwizzle::b128);
  const int64_t m_blocks = (p.seq_q + kBM - 1) / kBM, rows = p.batch * p.heads_q * m_blocks * kBM;
  runtime::Scratch stats(std::size_t(2 * rows) * sizeof(float), stream);
  runtime::Scratch dq_acc(std::size_t(rows * D) * sizeof(float), stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(dq_acc.data(), 0, dq_acc.bytes(), stream));
  prepare_kernel<T><<<unsigned((rows + 7) / 8), 256, 0, stream>>>(p, a.dout, a.sdo, a.lse, stats.as<float>(),
                                                                  stats.as<float>() + rows, m_blocks * kBM);
  TESSERA_LAUNCH_CHECK();
  Bwd f{};
  f.dk = a.dk, f.dv = a.dv, f.sdk = a.sdk, f.sdv = a.sdv, f.dq_acc = dq_acc.as<float>();
  f.lse2 = stats.as<float>(), f.delta = stats.as<float>() + rows, f.m_blocks = m_blocks;
  f.seq_q = p.seq_q, f.seq_k = p.seq_k, f.cu_q = p.cu_q, f.cu_k = p.cu_k, f.group = int(p.group);
  f.scale = p.scale, f.softcap = p.softcap, f.mul = (p.softcap > 0 ? 1.f : p.scale) * kLog2e;
  f.causal = p.causal, f.window_left = p.window_left, f.window_right = p.window_right;
  const dim3 grid(unsigned((p.seq_k + kBN - 1) / kBN), unsigned(p.heads_q / p.group), unsigned(p.batch));
  const std::size_t smem = sizeof(Smem<T, C>) + 1024;
  auto kernel = attention_bwd_sm90_kernel<T, C>;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, kThreads, smem, stream>>>(mq, mk, mv, mdo, f);
  TESSERA_LAUNCH_CHECK();
  const int64_t pairs = rows * (D / 2);
  finish_dq_kernel<T, D><<<unsigned((pairs + 255) / 256), 256, 0, stream>>>(p, dq_acc.as<float>(), a.dq, a.sdq,
                                                                          m_blocks);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace sm90_bwd

bool sm90_backward_can_implement(const Params& p, const BackwardArgs& a) {
  using namespace sm90_bwd;
  if (p.dtype != DType::bfloat16 && p.dtype != DType::float16) return false;
  if (p.dim != p.dim_v || (p.dim != 64 && p.dim != 128)) return false;
  if (runtime::device_props(p.device).major != 9 ||
      !runtime::has_sm90a_code(kernel_of<__nv_bfloat16, Shape<128>>()))
    return false;
  if (p.heads_q > 65535 || p.batch > 65535 || std::max({p.seq_q, p.seq_k, p.total_q, p.total_k}) > INT32_MAX / 2)
    return false;
  // dK and dV are written 16 bytes a thread.
  const auto aligned = [](const void* ptr, const Strides& s) {
    return s.d == 1 && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.s % 8 == 0 && s.h % 8 == 0 && s.b % 8 == 0;
  };
  if (!aligned(a.dk, a.sdk) || !aligned(a.dv, a.sdv)) return false;
  const Maps mp = maps_of(p, a.sdo);
  return runtime::tma_can_map(p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, a.dout, mp.dout, runtime::TmaSwizzle::b128);
}

void sm90_backward_launch(const Params& p, const BackwardArgs& a, cudaStream_t stream) {
  if (p.dim == 64) {
    if (p.dtype == DType::float16) sm90_bwd::launch_typed<__half, 64>(p, a, stream);
    else sm90_bwd::launch_typed<__nv_bfloat16, 64>(p, a, stream);
  } else {
    if (p.dtype == DType::float16) sm90_bwd::launch_typed<__half, 128>(p, a, stream);
    else sm90_bwd::launch_typed<__nv_bfloat16, 128>(p, a, stream);
  }
}

}  // namespace tessera::attn
