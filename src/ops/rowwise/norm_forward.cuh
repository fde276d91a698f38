// LayerNorm and RMSNorm forward: the kernels and their tiers (norm.cuh has what bounds them),
// instantiated once per dtype by norm_forward_<dtype>.cu, so that a build's cores share them.
//
// A row is read once into registers (VPT vectors of V = 16 / sizeof(T) elements per thread),
// reduced, normalized and written once. LayerNorm either sums x for the mean and then the squared
// deviations from it (two group reductions; no E[x^2] - E[x]^2 cancellation), or, where registers
// allow, has each thread take the mean and squared deviations of its own elements and merges
// those (count, mean, M2) triples in one reduction (Chan et al.): one barrier round per row
// instead of two. Weight and bias are read after the reductions (L1/L2 hits), a few vectors at a
// time. The tiers, first that takes the row (vectors of V per row):
//   warp: <= 64 vectors. A warp per row, VPT 1 or 2, four rows per CTA.
//   vpt8-group (sm_90, float32 256..2048 vectors, 16-bit 512 (LayerNorm) or 1024 (RMSNorm) to
//     2048): VPT 8 in a compile-time power-of-two group of 32..256 (the column offsets of the 8
//     vectors are immediates), one row per group, CTAs of >= 256 threads: more CTAs per SM and
//     fewer threads to reduce over than the VPT-4 tiers at these lengths.
//   prefetch: <= 1024 vectors. VPT 4 in groups of <= 256 threads, up to 80 registers.
//   vpt4: <= 4096 vectors (2048 for float32 on sm_90). VPT 4, one row per group of <= 1024.
//   vpt8-wide (float32, sm_90, <= 8192 vectors): VPT 8 in a fixed group of 512 or 1024 (fixed so
//     that the offsets are immediates; sm_80 spills even so): 512 threads keep two CTAs per SM
//     where 1024 x 4 would allow one.
//   stream: longer rows, read twice (norm_forward_stream_kernel).
// Short rows (warp, prefetch: <= 16 KB) are persistent and load each group's next row before they
// reduce the current one: with one row per group, nothing would be loaded while a row is reduced
// and stored, too little in flight for rows this short.
// With a residual (kAdd) a row is x + residual, so its loads hold twice the registers: the VPT-8
// tiers, whose rows fill the registers alone, do not take it (vpt4 takes float32 rows up to 4096
// vectors on sm_90 too), and the stream tier reads x and the residual once, writes their sum to
// residual_out in pass 1 and reads that back in pass 2.
#pragma once

#include <algorithm>
#include <string>

#include "ops/matrix/float8_quantize.cuh"
#include "ops/rowwise/norm.cuh"
#include "runtime/check.hpp"
#include "runtime/tier.hpp"

namespace tessera::norm {
namespace {

using runtime::ceil_div;

constexpr int kFwdCta = 128;   // smallest CTA: 4 rows of one warp each
constexpr int kFwdCta8 = 256;  // vpt8-group: CTAs of at least 256 threads (fp32 4096: two rows)
// prefetch: CTAs of up to 256 threads, 3 per SM, i.e. up to 80 registers per thread (two 64-byte
// row fragments do not fit in 64).
constexpr int kPrefetchCta = 256, kPrefetchBlocks = 3;
// The float8 tier: the prefetch tier's rows in one CTA per SM (Maxima), of 512 threads: at 768
// (the prefetch tier's threads per SM) the columns' maxima beside the rows spill from 80 registers.
constexpr int kMaxCta = 512;

// ---- register-resident rows -------------------------------------------------------------------
template <class T, int V, int VPT>
__device__ __forceinline__ void load_row(Frag<T, V> (&x)[VPT], const RowLanes<V>& part, const T* xr) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) x[k] = part.load(xr, k, 0.0f);
}

// x += r, rounded to T as torch's x + residual is (so residual_out holds torch's bits), stored to
// residual_out; the norm then reads the rounded sum, which is what the backward is given.
template <class T, int V, int VPT>
__device__ __forceinline__ void add_residual(Frag<T, V> (&x)[VPT], const Frag<T, V> (&r)[VPT], const RowLanes<V>& part,
                                             T* out) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    float s[V];
#pragma unroll
    for (int e = 0; e < V; ++e) s[e] = x[k][e] + r[k][e];
    x[k] = pack_each<T, V>(s);
    part.store(out, k, x[k]);
  }
}

// RMSNorm: mean(x^2).
template <class T, int V, int VPT, class Reduce>
__device__ __forceinline__ float mean_square(const Frag<T, V> (&x)[VPT], const Reduce& sum, int buf,
                                             const FwdParams<T>& p) {
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) q = fmaf(x[k][e], x[k][e], q);
  return sum(q, buf) * p.inv_n;
}

// LayerNorm in two reductions: the mean, then the squared deviations from it.
template <class T, int V, int VPT, class Reduce>
__device__ __forceinline__ void mean_var_two(Frag<T, V> (&x)[VPT], const RowLanes<V>& part, const Reduce& sum,
                                             const FwdParams<T>& p, float& mean, float& var) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) s += x[k][e];
  mean = sum(s, 0) * p.inv_n;
  refresh(x, mean, p.zero);
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (!part.in(k)) continue;  // past the row end: x = 0, would add mean^2
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = x[k][e] - mean;
      q = fmaf(d, d, q);
    }
  }
  var = sum(q, 1) * p.inv_n;
}

// LayerNorm in one reduction: this thread's mean and squared deviations from it over its `mine`
// elements (skipping vectors past the row end, which would add mean^2 each), merged over the group.
template <class T, int V, int VPT, class Reduce>
__device__ __forceinline__ void mean_var_merged(Frag<T, V> (&x)[VPT], const RowLanes<V>& part, const Reduce& sum,
                                                int buf, int mine, const FwdParams<T>& p, float& mean, float& var) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e) s += x[k][e];
  const float m = mine ? s * __fdividef(1.0f, float(mine)) : 0.0f;
  refresh(x, m, p.zero);  // convert x afresh below instead of holding the floats from above
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (!part.in(k)) continue;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = x[k][e] - m;
      q = fmaf(d, d, q);
    }
  }
  const Moments r = sum(Moments{float(mine), m, q}, buf);
  mean = r.mean;
  var = r.m2 * p.inv_n;
}

// A row's outputs, (x - mean) rstd w + b, with weight and bias loaded KB vectors at a time (see
// norm_forward_kernel), and its mean and rstd where asked for.
// `stored(k, y)` sees each vector y stored (the float8 norms' maxima).
template <int KB, class T, int V, int VPT, class P, class Stored>
__device__ __forceinline__ void store_normalized(const Frag<T, V> (&x)[VPT], const RowLanes<V>& part, const P& p,
                                                 const int64_t (&off)[4], float mean, float rstd, int after,
                                                 Stored&& stored) {
#pragma unroll
  for (int k0 = 0; k0 < VPT; k0 += KB) {
    Frag<T, V> w[KB], b[KB];
#pragma unroll
    for (int j = 0; j < KB; ++j) {
      w[j] = part.param(p.w, ones<T>(), k0 + j, 1.0f, after);
      b[j] = part.param(p.b, zeros<T>(), k0 + j, 0.0f, after);
    }
#pragma unroll
    for (int j = 0; j < KB; ++j) {
      float y[V];
#pragma unroll
      for (int e = 0; e < V; ++e) y[e] = fmaf((x[k0 + j][e] - mean) * rstd, w[j][e] + p.w_offset, b[j][e]);
      const Frag<T, V> out = pack_each<T, V>(y);
      part.store(p.out + off[1], k0 + j, out);
      stored(k0 + j, out);
    }
  }
  if (part.t == 0) {
    if (p.mean) p.mean[off[2]] = mean;
    if (p.rstd) p.rstd[off[3]] = rstd;
  }
}

// The float8 norms' maxima (kMax; MaxFwdParams): as each vector of the row is stored, the
// magnitudes of its 16-bit values (their bits with the sign cleared, two a word: the unsigned
// order of such bits is the magnitudes', inf above every finite value and NaN above inf, as
// float8_quantize.cuh orders them) folded into the row's maximum and the thread's columns' maxima,
// held in registers over all the group's rows. After a row, its maximum goes to amax[row]: a
// warp's by shuffles, one atomicMax a warp. After the last row, the columns' maxima go to shared
// memory (one atomicMax a column a group) and then to amax (one a column a CTA): the count of
// CTAs, not of rows, sets the global atomics, which is why this tier's CTAs are large.
template <class T, int V, int VPT>
struct Maxima {
  static_assert(sizeof(T) == 2 && V % 2 == 0, "16-bit values, two a word");
  uint32_t cols[VPT][V / 2] = {};
  uint32_t row = 0;
  __device__ __forceinline__ void fold(const RowLanes<V>& part, int k, const Frag<T, V>& y) {
    if (!part.in(k)) return;  // past the row's end: not an element
#pragma unroll
    for (int q = 0; q < V / 2; ++q) {
      const uint32_t m = y.w[q] & 0x7fff7fffu;
      cols[k][q] = __vmaxu2(cols[k][q], m);
      row = __vmaxu2(row, m);
    }
  }
  __device__ __forceinline__ void end_row(const MaxFwdParams<T>& p, int64_t r) {
    uint32_t m = max(row & 0xffffu, row >> 16);
    row = 0;
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
    if (p.rows_max && threadIdx.x % 32 == 0 && m) atomicMax(&p.amax[r], float8::mag_f32<T>(m));
  }
  // By every thread of the CTA (a CTA barrier inside); `smem`: p.n zeroed words.
  __device__ __forceinline__ void finish(const MaxFwdParams<T>& p, const RowLanes<V>& part, uint32_t* smem) {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const uint32_t m = cols[k][e / 2] >> 16 * (e % 2) & 0xffffu;
        if (part.in(k) && m) atomicMax(&smem[part.col(k) + e], float8::mag_f32<T>(m));
      }
    __syncthreads();
    uint32_t all = 0;
    for (int64_t c = threadIdx.x; c < p.n; c += blockDim.x) {
      const uint32_t m = smem[c];
      if (p.rows_max && m) atomicMax(&p.amax[p.rows + c], m);
      all = max(all, m);
    }
    if (p.rows_max) return;
#pragma unroll
    for (int off = 16; off >= 1; off /= 2) all = max(all, __shfl_xor_sync(0xffffffffu, all, off));
    if (threadIdx.x % 32 == 0 && all) atomicMax(p.amax, all);
  }
};
struct NoMaxima {
  template <class... A>
  __device__ __forceinline__ void fold(A&&...) {}
};

// Row groups of gs threads (kGs: fixed at compile time; 0: p.gs), VPT vectors per thread.
// kPrefetch: the loop is persistent (the launcher sizes the grid to the resident CTAs) and each
// group loads its next row into a second fragment before it reduces, normalizes and stores the
// current one: two rows per group resident instead of one.
// kMoments: LayerNorm merges moments (mean_var_merged) in the prefetching tiers where registers
// allow; ptxas spills with the merge at 64 or 128 bytes of row per thread without prefetch, and at
// 16-bit VPT 4 with it.
// KB: weight and bias are loaded KB vectors at a time after the reduction, all in flight together
// but not so many that they crowd the row out of the registers. 16-bit rows at VPT 8 take one at
// a time (with two, LayerNorm spills and is slower); float32 rms_norm in groups of 32 spills 8
// bytes with two, and is faster so than with one.
// kAdd: the row is x + p.res (add_residual). With prefetch, the next row's residual is loaded
// with its x where both fit beside the current row (VPT <= 2, kResAhead); at VPT 4 a row's
// residual is loaded when the row comes up, next to the next row's x in flight: three row
// fragments live instead of four.
// kMax: the float8 norms' maxima (Maxima), in CTAs of kMaxCta threads with p.n words of dynamic
// shared memory.
template <class T, int V, int VPT, bool kRms, bool kAdd, int kGs, bool kPrefetch, bool kMax = false>
__global__ __launch_bounds__(kMax ? kMaxCta : kPrefetch && VPT == 4 ? kPrefetchCta : kMaxThreads,
                             kMax ? 1 : kPrefetch && VPT == 4 ? kPrefetchBlocks : 1)
void norm_forward_kernel(const FwdP<T, kAdd, kMax> p) {
  constexpr bool kMoments = !kRms && kPrefetch && (sizeof(T) == 4 || VPT * V < 32);
  constexpr bool kResAhead = kAdd && kPrefetch && VPT <= 2;
  using Acc = std::conditional_t<kMoments, Moments, float>;
  using Op = std::conditional_t<kMoments, MergeMoments, tile::Sum>;
  __shared__ Acc slots[kBarrierGroups][2][32];
  constexpr int KB = VPT < 2 ? VPT : VPT == 8 && sizeof(T) == 2 ? 1 : 2;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (VPT > 4) {  // fits in 64 registers on sm_90 only; the launcher knows
    __trap();
    return;
  }
#endif
  const int gs = kGs ? kGs : p.gs, sub = threadIdx.x / gs, subs = blockDim.x / gs;
  const RowLanes<V> part{static_cast<int>(threadIdx.x) - sub * gs, gs, static_cast<int>(p.n)};
  GroupReduce<Acc, Op> sum{slots[sub < kBarrierGroups ? sub : 0][0], gs, 1 + sub, part.t >> 5};
  // Elements of this thread inside the row (vectors past its end read as 0 and are not counted).
  int mine = 0;
#pragma unroll
  for (int k = 0; k < VPT; ++k) mine += part.in(k) ? V : 0;
  const int64_t first = int64_t(blockIdx.x) * subs + sub;
  extern __shared__ uint32_t col_max[];  // kMax: the CTA's columns' maxima
  std::conditional_t<kMax, Maxima<T, V, VPT>, NoMaxima> maxima;
  if constexpr (kMax) {
    for (int64_t c = threadIdx.x; c < p.n; c += blockDim.x) col_max[c] = 0;
    __syncthreads();
  }
  Frag<T, V> x[VPT], r[kAdd ? VPT : 1];
  if (kPrefetch && first < p.rows) {
    load_row(x, part, p.x + first * p.stride[0]);
    if constexpr (kResAhead) load_row(r, part, p.res + first * p.res_stride[0]);
  }
  // Slot buffers alternate between consecutive reductions of a group: the barrier of the one in
  // between is passed only after every thread has read the buffer (see GroupReduce). With one
  // reduction per row they alternate by row.
  int buf = 0;
  for (int64_t row = first; row < p.rows; row += int64_t(gridDim.x) * subs, buf ^= 1) {
    int64_t off[4];
    row_offsets(p.stride, row, off);
    Frag<T, V> next[VPT], rnext[kResAhead ? VPT : 1];
    if constexpr (kPrefetch) {
      const int64_t nrow = row + int64_t(gridDim.x) * subs;
      if (nrow < p.rows) load_row(next, part, p.x + nrow * p.stride[0]);
      if constexpr (kResAhead)
        if (nrow < p.rows) load_row(rnext, part, p.res + nrow * p.res_stride[0]);
    } else {
      load_row(x, part, p.x + off[0]);
    }
    if constexpr (kAdd) {
      if constexpr (!kResAhead) load_row(r, part, p.res + row * p.res_stride[0]);
      add_residual(x, r, part, p.res_out + row * p.res_stride[1]);
    }

    float mean = 0.0f, var;
    if constexpr (kRms) var = mean_square(x, sum, buf, p);
    else if constexpr (!kMoments) mean_var_two(x, part, sum, p, mean, var);
    else mean_var_merged(x, part, sum, buf, mine, p, mean, var);
    const float rstd = rsqrtf(var + p.eps);
    refresh(x, rstd, p.zero);
    store_normalized<KB>(x, part, p, off, mean, rstd, zero_after(rstd, p.zero),
                         [&](int k, const Frag<T, V>& y) { maxima.fold(part, k, y); });
    if constexpr (kMax) maxima.end_row(p, row);
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        x[k] = next[k];
        if constexpr (kResAhead) r[k] = rnext[k];
      }
    }
  }
  if constexpr (kMax) maxima.finish(p, part, col_max);
}

// ---- long rows --------------------------------------------------------------------------------
// Rows longer than the register-resident tiers hold, read twice as torch.compile's norm kernels
// do: one 1024-thread CTA per SM, persistent over rows. Pass 1 reduces the row (RMSNorm: the sum
// of squares; LayerNorm: per-thread moments built chunk by chunk and merged, so mean and variance
// take one reduction), marking its lines L2 evict_last; pass 2 reads it again from L2
// (evict_first), normalizes and writes. Nothing of the row is held across the reduction. One row
// per SM at a time keeps the rows being read twice within the L2, and 4 vectors per thread in
// flight (64 KB per SM) keep enough bytes in flight.
constexpr int kLongThreads = 1024, kLongU1 = 4, kLongU2 = 2;  // vectors per thread in flight, passes 1 / 2

// The moments of U vectors at columns c0, c0 + step, ... (n is a multiple of V here, or V is 1: a
// vector is wholly in the row or wholly past it, and those past it read as 0).
template <class T, int V, int U>
__device__ __forceinline__ Moments chunk_moments(const Frag<T, V> (&x)[U], int64_t c0, int64_t step, int64_t n) {
  float cnt = 0.0f, sum = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (c0 + u * step < n) cnt += float(V);
#pragma unroll
    for (int e = 0; e < V; ++e) sum += x[u][e];
  }
  const float mean = sum * __fdividef(1.0f, cnt);
  float m2 = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (c0 + u * step >= n) continue;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float d = x[u][e] - mean;
      m2 = fmaf(d, d, m2);
    }
  }
  return Moments{cnt, mean, m2};
}

// The stream kernel's add_residual: x[u] (columns c0 + u * step) += the residual there, rounded to
// T, written to residual_out (`out`).
template <class T, int V, int U>
__device__ __forceinline__ void add_residual_chunk(Frag<T, V> (&x)[U], const T* res, T* out, int64_t c0,
                                                   int64_t step, int64_t n, uint64_t policy) {
  Frag<T, V> r[U];
#pragma unroll
  for (int u = 0; u < U; ++u)
    r[u] = c0 + u * step < n ? tile::load_frag_hint<T, V>(res + c0 + u * step, policy) : splat<T, V>(0.0f);
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float s[V];
#pragma unroll
    for (int e = 0; e < V; ++e) s[e] = x[u][e] + r[u][e];
    x[u] = pack_each<T, V>(s);
    if (c0 + u * step < n) tile::store_frag<T, V>(out + c0 + u * step, x[u]);
  }
}

// kAdd: pass 1 reads x and the residual (U1 / 2 vectors of each: the same bytes in flight), once
// (evict_first), and writes their sum to residual_out; pass 2 reads residual_out back (each thread
// the columns it wrote, with plain loads, which are ordered after its stores).
template <class T, int V, bool kRms, bool kAdd>
__global__ __launch_bounds__(kLongThreads, 1) void norm_forward_stream_kernel(const FwdP<T, kAdd> p) {
  constexpr int kThreads = kLongThreads, U1 = kAdd ? kLongU1 / 2 : kLongU1, U2 = kLongU2;
  using A = std::conditional_t<kRms, float, Moments>;
  using Op = std::conditional_t<kRms, tile::Sum, MergeMoments>;
  __shared__ A slots[64];
  const GroupReduce<A, Op> reduce{slots, kThreads, 1, int(threadIdx.x >> 5)};
  const uint64_t keep = tile::l2_policy<tile::L2Hint::kEvictLast>();
  const uint64_t drop = tile::l2_policy<tile::L2Hint::kEvictFirst>();
  const int64_t step = int64_t(kThreads) * V, n = p.n;
  int buf = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x, buf ^= 1) {
    int64_t off[4];
    row_offsets(p.stride, row, off);
    const T* xr = p.x + off[0];
    T* sr = nullptr;  // kAdd: the row of residual_out
    if constexpr (kAdd) sr = p.res_out + row * p.res_stride[1];
    A acc{};  // pass 1: this thread's sum of squares or moments, then the row's
    for (int64_t c0 = int64_t(threadIdx.x) * V; c0 < n; c0 += U1 * step) {
      Frag<T, V> x[U1];
#pragma unroll
      for (int u = 0; u < U1; ++u) {
        const int64_t c = c0 + u * step;
        x[u] = c < n ? tile::load_frag_hint<T, V>(xr + c, kAdd ? drop : keep) : splat<T, V>(0.0f);
      }
      if constexpr (kAdd) add_residual_chunk(x, p.res + row * p.res_stride[0], sr, c0, step, n, drop);
      if constexpr (kRms) {
#pragma unroll
        for (int u = 0; u < U1; ++u)
#pragma unroll
          for (int e = 0; e < V; ++e) acc = fmaf(x[u][e], x[u][e], acc);
      } else {
        acc = MergeMoments{}(acc, chunk_moments(x, c0, step, n));
      }
    }
    acc = reduce(acc, buf);
    float mean = 0.0f, rstd;
    if constexpr (kRms) {
      rstd = rsqrtf(acc * p.inv_n + p.eps);
    } else {
      mean = acc.mean;
      rstd = rsqrtf(acc.m2 * p.inv_n + p.eps);
    }
    for (int64_t c0 = int64_t(threadIdx.x) * V; c0 < n; c0 += U2 * step) {  // pass 2
      Frag<T, V> x[U2], w[U2], b[U2];
#pragma unroll
      for (int u = 0; u < U2; ++u) {
        const int64_t c = c0 + u * step;
        const bool in = c < n;
        if constexpr (kAdd) x[u] = in ? tile::load_frag<T, V>(sr + c) : splat<T, V>(0.0f);
        else x[u] = in ? tile::load_frag_hint<T, V>(xr + c, drop) : splat<T, V>(0.0f);
        w[u] = in && p.w ? tile::load_frag<T, V>(p.w + c) : splat<T, V>(1.0f);
        b[u] = in && p.b ? tile::load_frag<T, V>(p.b + c) : splat<T, V>(0.0f);
      }
#pragma unroll
      for (int u = 0; u < U2; ++u) {
        const int64_t c = c0 + u * step;
        if (c >= n) continue;
        float y[V];
#pragma unroll
        for (int e = 0; e < V; ++e) y[e] = fmaf((x[u][e] - mean) * rstd, w[u][e] + p.w_offset, b[u][e]);
        tile::store_frag<T, V>(p.out + off[1] + c, pack_each<T, V>(y));
      }
    }
    if (threadIdx.x == 0) {
      if (p.mean) p.mean[off[2]] = mean;
      if (p.rstd) p.rstd[off[3]] = rstd;
    }
  }
}

// ---- tiers ------------------------------------------------------------------------------------
template <class P>  // P: the kernel's parameters (FwdP)
struct FwdPlan {
  void (*kernel)(P) = nullptr;
  unsigned grid = 0;
  int threads = 0, gs = 0, vpt = 0;
  std::string describe() const {
    return std::to_string(grid) + " CTAs x " + std::to_string(threads) + " threads, " +
           (gs ? "rows in groups of " + std::to_string(gs) + ", " + std::to_string(vpt) + " vectors per thread"
               : std::string("a row at a time per CTA"));
  }
};

// Row groups of gs threads; CTAs of at least `cta` threads (several groups when gs is small).
// Without prefetch one row per group; with it the grid is persistent: no more CTAs than are
// resident at once, each group looping over rows with the next one's loads in flight. Of those,
// only as many as give every group the same number of rows (+- 1): with 4096 rows and 3168
// resident groups, 2048 groups of 2 rows rather than 928 of 2 and 2240 of 1: the kernel takes
// two rows' time either way, and the fewer groups compete less for bandwidth.
template <class T, int V, int VPT, bool kRms, bool kAdd, int kGs = 0, bool kPrefetch = false>
FwdPlan<FwdP<T, kAdd>> plan_groups(const FwdParams<T>& p, int gs, int cta = kFwdCta) {
  const int subs = gs < cta && cta % gs == 0 ? cta / gs : 1;
  const auto kernel = norm_forward_kernel<T, V, VPT, kRms, kAdd, kGs, kPrefetch>;
  int64_t grid = ceil_div(p.rows, subs);
  if constexpr (kPrefetch) {
    const int64_t resident = int64_t(runtime::resident_ctas(reinterpret_cast<const void*>(kernel), gs * subs)) * subs;
    const int64_t per_group = ceil_div(p.rows, resident);
    grid = ceil_div(ceil_div(p.rows, per_group), subs);
  }
  return {kernel, runtime::grid_cap(grid), gs * subs, gs, VPT};
}

// What every forward tier shares: its parameters' type and its launch.
template <class T, bool kAdd>
struct FwdTier {
  using P = FwdP<T, kAdd>;
  static void launch(const P& args, const FwdPlan<P>& plan, cudaStream_t stream) {
    P p = args;
    p.gs = plan.gs;
    plan.kernel<<<plan.grid, plan.threads, 0, stream>>>(p);
  }
};

template <class T, int V, bool kRms, bool kAdd, int VPT>
struct Warp : FwdTier<T, kAdd> {
  static constexpr const char* kName = VPT == 1 ? "warp" : "warp-2";
  static constexpr const char* kWhen = VPT == 1 ? "rows of <= 32 vectors" : "rows of <= 64 vectors";
  static bool can_implement(const FwdP<T, kAdd>& p, const Ctx&) { return vectors<V>(p.n) <= 32 * VPT; }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx&) {
    return plan_groups<T, V, VPT, kRms, kAdd, 0, true>(p, 32);
  }
};

// 16-bit RMSNorm rows of 512..1023 vectors stay on the prefetching tier, which is faster there.
// Not with a residual (see the top).
template <class T, int V, bool kRms, bool kAdd>
struct Vpt8Group : FwdTier<T, kAdd> {
  static constexpr const char* kName = "vpt8-group";
  static constexpr const char* kWhen = "sm_90, mid-length rows (float32 256..2048 vectors, 16-bit 512|1024..2048)";
  static bool can_implement(const FwdP<T, kAdd>& p, const Ctx& c) {
    const int64_t nv = vectors<V>(p.n);
    return V > 1 && !kAdd && c.major >= 9 && nv <= 2048 && nv >= (V == 4 ? 256 : kRms ? 1024 : 512);
  }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx&) {
    if constexpr (V > 1 && !kAdd) {
      int gs = 32;
      while (gs * 8 < vectors<V>(p.n)) gs *= 2;
      const auto make = [&](auto g) { return plan_groups<T, V, 8, kRms, kAdd, decltype(g)::value>(p, g, kFwdCta8); };
      if constexpr (V == 4) return with_size<32, 64, 128, 256>(gs, make);
      else if constexpr (kRms) return with_size<128, 256>(gs, make);  // RMSNorm: >= 1024 vectors
      else return with_size<64, 128, 256>(gs, make);  // 16-bit LayerNorm rows here have >= 512
    } else {
      return {};
    }
  }
};

template <class T, int V, bool kRms, bool kAdd>
struct Prefetch : FwdTier<T, kAdd> {
  static constexpr const char* kName = "prefetch";
  static constexpr const char* kWhen = "rows of <= 1024 vectors";
  static bool can_implement(const FwdP<T, kAdd>& p, const Ctx&) { return vectors<V>(p.n) <= 4 * kPrefetchCta; }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx&) {
    return plan_groups<T, V, 4, kRms, kAdd, 0, true>(p, round_up32(ceil_div(vectors<V>(p.n), 4)));
  }
};

template <class T, int V, bool kRms, bool kAdd>
struct Vpt4 : FwdTier<T, kAdd> {
  static constexpr const char* kName = "vpt4";
  static constexpr const char* kWhen = "rows of <= 4096 vectors (2048 for float32 on sm_90 without a residual)";
  static bool can_implement(const FwdP<T, kAdd>& p, const Ctx& c) {
    const bool wide = V == 4 && c.major >= 9 && !kAdd;
    return vectors<V>(p.n) <= (wide ? 2 : 4) * kMaxThreads;
  }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx&) {
    return plan_groups<T, V, 4, kRms, kAdd>(p, round_up32(ceil_div(vectors<V>(p.n), 4)));
  }
};

template <class T, int V, bool kRms, bool kAdd>
struct Vpt8Wide : FwdTier<T, kAdd> {
  static constexpr const char* kName = "vpt8-wide";
  static constexpr const char* kWhen = "float32 on sm_90 without a residual, rows of <= 8192 vectors";
  static bool can_implement(const FwdP<T, kAdd>& p, const Ctx& c) {
    return V == 4 && !kAdd && c.major >= 9 && vectors<V>(p.n) <= 8 * kMaxThreads;
  }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx&) {
    if constexpr (V == 4 && !kAdd) {
      if (vectors<V>(p.n) <= 4 * kMaxThreads) return plan_groups<T, V, 8, kRms, kAdd, 512>(p, 512);
      return plan_groups<T, V, 8, kRms, kAdd, 1024>(p, 1024);
    } else {
      return {};
    }
  }
};

template <class T, int V, bool kRms, bool kAdd>
struct Stream : FwdTier<T, kAdd> {
  static constexpr const char* kName = "stream";
  static constexpr const char* kWhen = "rows longer than the register tiers hold: read twice, one CTA per SM";
  static bool can_implement(const FwdP<T, kAdd>&, const Ctx&) { return true; }
  static FwdPlan<FwdP<T, kAdd>> plan(const FwdP<T, kAdd>& p, const Ctx& c) {
    return {norm_forward_stream_kernel<T, V, kRms, kAdd>, runtime::grid_cap(std::min<int64_t>(p.rows, c.sms)),
            kLongThreads, 0, 0};
  }
};

template <class T, int V, bool kRms, bool kAdd>
void forward_tiers(const char* op, const FwdP<T, kAdd>& p, const Ctx& ctx, cudaStream_t stream) {
  runtime::run_first<Warp<T, V, kRms, kAdd, 1>, Warp<T, V, kRms, kAdd, 2>, Vpt8Group<T, V, kRms, kAdd>,
                     Prefetch<T, V, kRms, kAdd>, Vpt4<T, V, kRms, kAdd>, Vpt8Wide<T, V, kRms, kAdd>,
                     Stream<T, V, kRms, kAdd>>(op, p, ctx, stream);
}

template <class T, int V, bool kRms>
void forward_v(const char* op, const AddFwdParams<T>& p, const Ctx& ctx, cudaStream_t stream) {
  if (p.res) forward_tiers<T, V, kRms, true>(op, p, ctx, stream);
  else forward_tiers<T, V, kRms, false>(op, static_cast<const FwdParams<T>&>(p), ctx, stream);
}

// The float8 norms' tier (MaxFwdParams): the rows rms_norm and add_rms_norm take on their
// persistent tiers (warp, warp-2, prefetch), on those tiers' own row groups and vectors per thread
// (so that the output's bits are theirs), in CTAs of kMaxCta threads, one per SM: as many groups
// as fit in one CTA, so that their columns' maxima meet in its shared memory before they go to
// global memory (Maxima). Not the rows the vpt8-group tier takes (1024..2048 vectors on sm_90
// without a residual): its groups hold one row each, which would leave a column's maxima as many
// atomics as rows.
template <class T, int V, bool kAdd>
struct Float8Rows {
  using P = MaxFwdParams<T>;
  static constexpr const char* kName = "float8-rows";
  static constexpr const char* kWhen =
      "RMSNorm with float8 outputs: 16-bit rows of the warp and prefetch tiers (<= 1024 vectors, < 1024 on sm_90 "
      "without a residual)";
  static bool can_implement(const P& p, const Ctx& c) {
    if constexpr (!kAdd)
      if (Vpt8Group<T, V, true, false>::can_implement(p, c)) return false;
    return vectors<V>(p.n) <= 4 * kPrefetchCta;
  }
  static FwdPlan<P> plan(const P& p, const Ctx&) {
    const int64_t nv = vectors<V>(p.n);
    const auto make = [&](auto vpt) {
      constexpr int VPT = decltype(vpt)::value;
      const auto kernel = norm_forward_kernel<T, V, VPT, true, kAdd, 0, true, true>;
      const int gs = VPT < 4 ? 32 : round_up32(ceil_div(nv, 4)), subs = kMaxCta / gs;
      const size_t smem = size_t(p.n) * sizeof(uint32_t);
      const int64_t resident =
          int64_t(runtime::resident_ctas(reinterpret_cast<const void*>(kernel), gs * subs, smem)) * subs;
      const int64_t per_group = ceil_div(p.rows, resident);
      return FwdPlan<P>{kernel, runtime::grid_cap(ceil_div(ceil_div(p.rows, per_group), subs)), gs * subs, gs, VPT};
    };
    if (nv <= 32) return make(std::integral_constant<int, 1>{});
    if (nv <= 64) return make(std::integral_constant<int, 2>{});
    return make(std::integral_constant<int, 4>{});
  }
  static void launch(const P& args, const FwdPlan<P>& plan, cudaStream_t stream) {
    P p = args;
    p.gs = plan.gs;
    plan.kernel<<<plan.grid, plan.threads, size_t(p.n) * sizeof(uint32_t), stream>>>(p);
  }
};

}  // namespace

template <class T>
bool forward_float8(const char* op, const MaxFwdParams<T>& p, const Ctx& ctx, cudaStream_t stream) {
  if constexpr (sizeof(T) != 2) {
    return false;
  } else {
    constexpr int V = tile::kVec16<T>;
    const bool ran = p.res ? runtime::try_tier<Float8Rows<T, V, true>>(op, p, ctx, stream)
                           : runtime::try_tier<Float8Rows<T, V, false>>(op, p, ctx, stream);
    if (ran) TESSERA_LAUNCH_CHECK();
    return ran;
  }
}

template <class T>
void forward(const char* op, const AddFwdParams<T>& p, bool rms, bool vec, const Ctx& ctx, cudaStream_t stream) {
  constexpr int V = tile::kVec16<T>;
  if (rms) vec ? forward_v<T, V, true>(op, p, ctx, stream) : forward_v<T, 1, true>(op, p, ctx, stream);
  else vec ? forward_v<T, V, false>(op, p, ctx, stream) : forward_v<T, 1, false>(op, p, ctx, stream);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace tessera::norm
