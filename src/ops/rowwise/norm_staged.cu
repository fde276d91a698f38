// LayerNorm and RMSNorm backward on sm_90 with the rows staged in shared memory: the staged tier
// of the backward's list (norm_backward.cuh has the column sums and the other tiers).
//
// Rows of up to 64 KB of x and dy. Each row group keeps a ring of p.stages rows (x and dy, and for
// the add-norms the gradient of residual_out, which dx adds) in shared memory, filled by bulk
// copies that its first thread issues, so the next rows' loads stay in flight while the group
// computes, however few registers that leaves. The registers then go
// where the register-resident kernel cannot afford them, at 16 elements per thread (twice as many
// rows' worth of overhead saved per reduction as one vector per thread):
//   - the weight as floats, and dw/db as fp32 sums per owned column (no shared-memory
//     read-modify-write per row);
//   - one pass over the staged row computes the two row sums dx needs AND the row's dw/db terms,
//     and keeps xhat and w dy as floats; after the reduction dx is one FMA pair per element and
//     the slot is already free for the next fill. (32 elements per thread, 16-bit rows over 4096:
//     those floats do not fit, so the dx pass reads x and dy from the slot again, and the slot
//     is refilled one row later.)
// Slot of the group's i-th row: i % p.stages, filled for the (i / p.stages)-th time, so its
// barrier phase has parity (i / p.stages) & 1. A slot is refilled once every thread of the group
// is done with it, which the row reduction's barrier (or a warp's shuffles) guarantees. Rows go to
// groups as in the register-resident kernel (a function of the shape and the GPU), and the
// groups' sums are added in group order at the end: dw/db are deterministic.
#include <algorithm>
#include <string>

#include "ops/rowwise/norm.cuh"
#include "runtime/device.hpp"
#include "tile/bulk.cuh"
#include "tile/sync.cuh"

namespace tessera::norm {
namespace {

using runtime::ceil_div;

constexpr int kMaxStages = 8;  // most ring slots per row group

// A row group's ring of slots in shared memory, [slot][x, dy (, dres)][n], one transaction barrier
// each.
template <class T, bool kAdd>
struct Ring {
  static constexpr int kRows = kAdd ? 3 : 2;  // rows a slot holds
  T* slots;
  uint64_t* full;
  uint32_t row_bytes;
  __device__ __forceinline__ tile::BulkBarrier bar(int s) const { return tile::BulkBarrier{&full[s]}; }
  __device__ __forceinline__ T* slot(int s, int64_t n) const { return slots + int64_t(s) * kRows * n; }
  // By the group's leader: row `row` of x, dy (and dres) into slot s.
  __device__ __forceinline__ void fill(int s, int64_t row, const BwdP<T, kAdd>& p) const {
    T* dst = slot(s, p.n);
    bar(s).expect(kRows * row_bytes);
    bar(s).copy(dst, p.x + row * p.stride[0], row_bytes);
    bar(s).copy(dst + p.n, p.dy + row * p.stride[1], row_bytes);
    if constexpr (kAdd) bar(s).copy(dst + 2 * p.n, dres_row(p, row), row_bytes);
  }
};

// What a thread keeps in registers across rows: the weight (as floats at 16 elements per thread,
// packed and converted where used at 32), its dw/db column sums, and at 16 elements per thread
// the row's xhat and w dy between the two passes (at 32 they would not fit: the dx pass reads x
// and dy from the slot again, which then is refilled one row later).
template <class T, int V, int VPT>
struct Regs {
  static constexpr int E = VPT * V;
  static constexpr bool kKeep = E <= 16;
  Frag<T, V> wp[VPT];
  float wf[E], sb[E], sw[E];
  float xh[kKeep ? E : 1], g[kKeep ? E : 1];
  float w_offset;  // BwdParams::w_offset, folded into wf where the weight is kept as floats
  __device__ __forceinline__ float w(int k, int e) const { return kKeep ? wf[k * V + e] : wp[k][e] + w_offset; }
};

template <bool kRms, class T>
__device__ __forceinline__ void row_stats(const BwdParams<T>& p, int64_t row, float& mean, float& rstd) {
  mean = kRms || row >= p.rows ? 0.0f : p.mean[row * p.stride[3]];
  rstd = row >= p.rows ? 0.0f : p.rstd[row * p.stride[4]];
}

// One pass over the staged row: the two row sums dx needs, and the row's dw/db terms.
template <bool kRms, class T, int V, int VPT>
__device__ __forceinline__ Pair row_pass(Regs<T, V, VPT>& r, const RowLanes<V>& part, const T* xs, const T* dys,
                                         float rstd, float shift) {
  Pair acc{0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    const bool in = part.in(k);
    const Frag<T, V> xv = in ? tile::load_frag<T, V>(xs + part.col(k)) : splat<T, V>(0.0f);
    const Frag<T, V> dv = in ? tile::load_frag<T, V>(dys + part.col(k)) : splat<T, V>(0.0f);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = dv[e], xhat = fmaf(xv[e], rstd, shift), gw = d * r.w(k, e);
      if constexpr (Regs<T, V, VPT>::kKeep) r.xh[k * V + e] = xhat, r.g[k * V + e] = gw;
      if constexpr (!kRms) acc.a += gw;
      acc.b = fmaf(gw, xhat, acc.b);
      r.sw[k * V + e] = fmaf(d, xhat, r.sw[k * V + e]);
      if constexpr (!kRms) r.sb[k * V + e] += d;
    }
  }
  return acc;
}

// dx = rstd (w dy - ma - xhat mb) = (w dy - xhat mb) rstd + c; kAdd: + dres (staged in the slot).
template <bool kAdd, class T, int V, int VPT>
__device__ __forceinline__ void write_dx(const Regs<T, V, VPT>& r, const RowLanes<V>& part, const T* xs,
                                         const T* dys, const T* dres, T* dx, float rstd, float shift, float mb,
                                         float c) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (!part.in(k)) continue;
    Frag<T, V> xv, dv, d;
    if constexpr (!Regs<T, V, VPT>::kKeep) xv = tile::load_frag<T, V>(xs + part.col(k)), dv = tile::load_frag<T, V>(dys + part.col(k));
    if constexpr (kAdd) d = tile::load_frag<T, V>(dres + part.col(k));
    float out[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float xhat = r.kKeep ? r.xh[k * V + e] : fmaf(xv[e], rstd, shift);
      const float gw = r.kKeep ? r.g[k * V + e] : dv[e] * r.w(k, e);
      out[e] = fmaf(fmaf(-xhat, mb, gw), rstd, c);
      if constexpr (kAdd) out[e] += d[e];
    }
    tile::store_frag<T, V>(dx + part.col(k), pack_each<T, V>(out));
  }
}

// The groups' column sums into the CTA's partial rows. Every copy issued was waited for, so the
// ring is free: it takes the sums as planes in write_partial's layout (ColumnSums), one plane per
// group, added there in group order.
template <int kGs, int kSubs, class T, int V, int VPT>
__device__ __forceinline__ void write_sums(const Regs<T, V, VPT>& r, const RowLanes<V>& part, const BwdParams<T>& p,
                                           float* planes, int sub, bool want_w, bool want_b) {
  constexpr int Q = ColumnSums<VPT, V>::Q;
  const int plane = VPT * V * kGs;
  const ColumnSums<VPT, V> mine(planes + sub * plane, kGs, part.t);
  const int64_t prow = int64_t(blockIdx.x) * p.ld;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    if (which == 0 ? !want_w : !want_b) continue;  // uniform
    const float* src = which == 0 ? r.sw : r.sb;
    __syncthreads();
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int j = 0; j < V / Q; ++j) {
        tile::Vec<float, Q> v;
#pragma unroll
        for (int q = 0; q < Q; ++q) v[q] = src[k * V + j * Q + q];
        tile::store<Q>(mine.at(k, j), v);
      }
    __syncthreads();
    write_partial<VPT, V>((which == 0 ? p.part_w : p.part_b) + prow, planes, plane, kSubs, kGs, part.n);
  }
}

// kFirstFills: two slots first, the rest once the first row has landed: all slots at once (up to
// 25 MB over the GPU) would let every group's first row land only near the end of that transfer,
// with nothing to compute meanwhile. (At 32 elements per thread, with three slots and no
// registers to spare, all at once.)
template <class T, int V, int VPT, bool kRms, bool kAdd, int kGs, int kSubs>
__global__ __launch_bounds__(kGs * kSubs, 1) void norm_backward_staged_kernel(const BwdP<T, kAdd> p) {
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ uint64_t full[kSubs][kMaxStages];
  __shared__ Pair slots[kSubs][2][32];
  using R = Regs<T, V, VPT>;
  const int sub = threadIdx.x / kGs, stages = p.stages;
  const RowLanes<V> part{static_cast<int>(threadIdx.x) - sub * kGs, kGs, static_cast<int>(p.n)};
  const GroupReduce<Pair> sum{slots[sub][0], kGs, 1 + sub, part.t >> 5};
  const bool want_w = p.part_w != nullptr, want_b = !kRms && p.part_b != nullptr;
  const bool leader = part.t == 0;
  using Rg = Ring<T, kAdd>;
  const Rg ring{reinterpret_cast<T*>(staged) + int64_t(sub) * stages * Rg::kRows * p.n, full[sub],
                static_cast<uint32_t>(p.n * sizeof(T))};
  const int64_t first = int64_t(blockIdx.x) * kSubs + sub, stride = int64_t(gridDim.x) * kSubs;

  if (leader) {
    for (int s = 0; s < stages; ++s) ring.bar(s).init();
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  constexpr int kFirstFills = R::E <= 16 ? 2 : kMaxStages;
  if (leader)
    for (int s = 0; s < kFirstFills && s < stages; ++s)
      if (first + s * stride < p.rows) ring.fill(s, first + s * stride, p);

  R r;
  r.w_offset = p.w_offset;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    r.wp[k] = part.in(k) && p.w ? tile::load_frag<T, V>(p.w + part.col(k)) : splat<T, V>(1.0f);
#pragma unroll
    for (int e = 0; e < V; ++e)
      r.wf[k * V + e] = r.wp[k][e] + r.w_offset, r.sw[k * V + e] = 0.0f, r.sb[k * V + e] = 0.0f;
  }
  float mean, rstd;
  row_stats<kRms>(p, first, mean, rstd);
  int i = 0, s = 0;
  uint32_t parity = 0;
  for (int64_t row = first; row < p.rows; row += stride, ++i) {
    float mean_next, rstd_next;  // one row ahead: their latency hides behind this row
    row_stats<kRms>(p, row + stride, mean_next, rstd_next);
    ring.bar(s).wait(parity);
    if constexpr (kFirstFills < kMaxStages) {
      if (i == 0 && leader)
        for (int t = kFirstFills; t < stages; ++t)
          if (first + t * stride < p.rows) ring.fill(t, first + t * stride, p);
    }
    const T* xs = ring.slot(s, p.n);
    const T* dys = xs + p.n;
    const float shift = -mean * rstd;  // xhat = x * rstd + shift
    Pair acc = row_pass<kRms>(r, part, xs, dys, rstd, shift);
    if (p.dx) {
      acc = sum(acc, i & 1);
    } else {  // no reduction: the group still meets, for the refill below
      __syncwarp();
      if (kGs > 32) tile::group_sync(1 + sub, kGs);
    }
    if constexpr (R::kKeep && !kAdd) {
      asm volatile("" ::: "memory");  // the staged row is read above this line, never below
      // Every thread of the group is done with slot s: it takes row i + stages.
      if (leader && row + stages * stride < p.rows) ring.fill(s, row + stages * stride, p);
    } else if (!R::kKeep && leader && i > 0 && row + (stages - 1) * stride < p.rows) {
      // Every thread of the group is done with the previous row's slot.
      ring.fill(s == 0 ? stages - 1 : s - 1, row + (stages - 1) * stride, p);
    }
    if (p.dx)
      write_dx<kAdd>(r, part, xs, dys, xs + 2 * p.n, p.dx + row * p.stride[2], rstd, shift, acc.b * p.inv_n,
                     kRms ? 0.0f : -acc.a * p.inv_n * rstd);
    if constexpr (R::kKeep && kAdd) {  // dres is read from slot s by write_dx: refilled after it
      __syncwarp();
      if (kGs > 32) tile::group_sync(1 + sub, kGs);
      if (leader && row + stages * stride < p.rows) ring.fill(s, row + stages * stride, p);
    }
    mean = mean_next, rstd = rstd_next;
    if (++s == stages) s = 0, parity ^= 1u;
  }
  if (!want_w && !want_b) return;  // uniform over the grid
  write_sums<kGs, kSubs>(r, part, p, reinterpret_cast<float*>(staged), sub, want_w, want_b);
}

// The kernel with groups of kGs threads holding VPT vectors each: kSubs = 512 / kGs groups per
// CTA, one CTA per SM, as many ring slots per group as ~200 KB allow. None when fewer than 3 fit
// (one row in flight would not beat the register-resident tiers).
template <class T, int V, bool kRms, bool kAdd, int kGs, int VPT>
BwdPlan<BwdP<T, kAdd>> staged_plan(int64_t n, int64_t rows, const Ctx& c) {
  constexpr int kSubs = 512 / kGs;
  const auto kernel = norm_backward_staged_kernel<T, V, VPT, kRms, kAdd, kGs, kSubs>;
  const std::size_t budget = std::min<std::size_t>(
      c.smem_optin - runtime::static_smem_bytes(reinterpret_cast<const void*>(kernel)), 200 * 1024);
  const std::size_t slot = (kAdd ? 3 : 2) * std::size_t(n) * sizeof(T);
  const int stages = static_cast<int>(std::min<std::size_t>(kMaxStages, budget / (kSubs * slot)));
  if (stages < 3) return {};
  BwdPlan<BwdP<T, kAdd>> pl;
  pl.kernel = kernel;
  pl.gs = kGs;
  pl.threads = kGs * kSubs;
  pl.stages = stages;
  pl.elems = VPT * V;
  pl.smem = std::max(kSubs * stages * slot, std::size_t(kSubs) * VPT * V * kGs * sizeof(float));
  // The fewest CTAs (<= one per SM) that give no group more rows than one per SM would: every
  // group then has the same number of rows, +-1, and the DRAM stays busy to the end (4096 rows:
  // 128 CTAs of 16 rows per group rather than 132 with 15 or 16).
  const int64_t per_group = ceil_div(rows, int64_t(c.sms) * kSubs);
  pl.grid = ceil_div(rows, kSubs * per_group);
  return pl;
}

}  // namespace

// Rows go to the 32-element tier where it is built (bf16, and fp16 RMSNorm: fp16 LayerNorm's
// conversions leave it spilling there) and they are over 4096 elements (at 8192: two groups per CTA instead of one), to the
// 16-element tier otherwise; each takes the smallest power-of-two group (>= 256 / >= 32 threads)
// that holds the row, of at most 512 threads. The two ranges do not overlap: a row whose tier has
// fewer than 3 slots goes on to the register tiers.
// The 32-element kernels are built for bf16 and fp16 RMSNorm only.
template <class T, int V, bool kRms, int E>
constexpr bool kStagedBuilt = E == 16 || std::is_same_v<T, __nv_bfloat16> || (sizeof(T) == 2 && kRms);

template <class T, int V, bool kRms, bool kAdd, int E>
bool Staged<T, V, kRms, kAdd, E>::in_range(int64_t nv) {
  constexpr bool kWide = kStagedBuilt<T, V, kRms, 32>;
  if constexpr (E == 32) return kWide && nv > 512 && nv <= 512 * E / V;
  else return !(kWide && nv > 512) && nv <= 512 * E / V;
}

template <class T, int V, bool kRms, bool kAdd, int E>
BwdPlan<BwdP<T, kAdd>> Staged<T, V, kRms, kAdd, E>::plan(const BwdArgs<T>& a, const Ctx& c) {
  if constexpr (kStagedBuilt<T, V, kRms, E>) {
    const int64_t n = a.p.n, rows = a.p.rows, nv = vectors<V>(n);
    if (c.major < 9 || !in_range(nv)) return {};
    int gs = E == 32 ? 256 : 32;
    while (int64_t(gs) * (E / V) < nv) gs *= 2;
    const auto make = [&](auto g) { return staged_plan<T, V, kRms, kAdd, decltype(g)::value, E / V>(n, rows, c); };
    if constexpr (E == 32) return with_size<256, 512>(gs, make);
    else return with_size<32, 64, 128, 256, 512>(gs, make);
  } else {
    return {};
  }
}

template <class T, int V, bool kRms, bool kAdd, int E>
bool Staged<T, V, kRms, kAdd, E>::can_implement(const BwdArgs<T>& a, const Ctx& c) {
  return plan(a, c).kernel != nullptr;
}

#define TESSERA_STAGED(T, V)                                                                        \
  template struct Staged<T, V, false, false, 16>;                                                   \
  template struct Staged<T, V, false, false, 32>;                                                   \
  template struct Staged<T, V, true, false, 16>;                                                    \
  template struct Staged<T, V, true, false, 32>;                                                    \
  template struct Staged<T, V, false, true, 16>;                                                    \
  template struct Staged<T, V, false, true, 32>;                                                    \
  template struct Staged<T, V, true, true, 16>;                                                     \
  template struct Staged<T, V, true, true, 32>;
TESSERA_STAGED(float, 4)
TESSERA_STAGED(__half, 8)
TESSERA_STAGED(__nv_bfloat16, 8)
#undef TESSERA_STAGED

}  // namespace tessera::norm
