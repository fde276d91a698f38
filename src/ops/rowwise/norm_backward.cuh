// LayerNorm and RMSNorm backward: the register-resident and long-row tiers, the column sums of
// dw/db, and the tier list (the sm_90 staged tier is in norm_staged.cu; norm.cuh has what bounds
// them), instantiated once per dtype by norm_backward_<dtype>.cu, so that a build's cores share
// them.
//
// dx needs two row sums, sum(w dy) and sum(w dy xhat), reduced together as a pair. dw = the sum
// over rows of dy * xhat and db = the sum of dy are column sums: each thread owns fixed columns
// and adds its rows' contributions in fp32 (no atomics), so x and dy are read once for all three
// gradients. The grid is persistent and a function of the shape and the GPU only: row r always
// goes to the same CTA and row group, each CTA adds its groups' sums in group order into one
// partial row [N] in scratch memory, and sum_partials_kernel adds the G partial rows of each
// column in a fixed order. dw and db are therefore the same bits on every run. The partials are
// G x N x 8 bytes with G about the number of SMs, small beside the rows, written and read back
// mostly through L2.
//
// add_*_norm's backward (kAdd: kernels of their own, BwdP) adds dres to dx, reading it where dx is
// written: x is then residual_out, and dx the gradient of both input and residual.
//
// The tiers, first that takes the row (vectors of V elements per row):
//   staged-32, staged (norm_staged.cu): sm_90, 16-byte vectors, rows whose x and dy fit three
//     times in ~200 KB of shared memory; 32 elements per thread for bf16 and fp16 RMSNorm rows of
//     over 4096 elements, 16 otherwise.
//   registers: one 1024-thread CTA per SM split into row groups of gs = N / (VPT V) threads, the
//     row (and, with a ring, the next one) in registers; the weight is copied to shared memory
//     once per CTA and the column sums take VPT V floats per thread and plane in shared memory.
//     16-byte vectors: VPT 1 with a ring of two rows (<= 256 vectors); VPT 2 without one (<=
//     1024: half the threads per row of VPT 1, so twice the groups per SM); VPT 2 in one group of
//     1024 with a ring of two (<= 2048); float32 VPT 4 in one group of 1024 (<= 4096; the row, x
//     and dy, is already 128 KB per SM). V = 1: VPT 1, ring of two (<= 1024); VPT 4, ring of two
//     (<= 4096); VPT 8 in one group of 1024 (<= 8192).
//   long-rows: longer rows, or column-sum planes over the GPU's shared memory per CTA: the row
//     means dx needs (norm_backward_rowsums_kernel), then column slices over row ranges
//     (norm_backward_cols_kernel) with the column sums in registers; x and dy are read twice.
#pragma once

#include <algorithm>
#include <string>

#include "ops/rowwise/norm.cuh"
#include "runtime/check.hpp"
#include "runtime/launch.cuh"
#include "runtime/tier.hpp"

namespace tessera::norm {
namespace {

using runtime::ceil_div;

constexpr int kStreamThreads = 512;  // long-row backward row sums: one CTA per row
constexpr int kStreamUnroll = 4;     // vectors per thread loaded before they are used
constexpr int kSumThreads = 1024, kSumSplit = 32;  // sum_partials_kernel: block, most row slices

// ---- register-resident rows -------------------------------------------------------------------
template <class T, int V, int VPT>
struct BwdRow {
  Frag<T, V> x[VPT], dy[VPT];
  float mean, rstd;
};

// x, dy and the statistics of a row.
template <bool kRms, class T, int V, int VPT>
__device__ __forceinline__ void load_row(BwdRow<T, V, VPT>& r, const RowLanes<V>& part, const BwdParams<T>& p,
                                         int64_t row) {
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    r.x[k] = part.load(p.x + row * p.stride[0], k, 0.0f);
    r.dy[k] = part.load(p.dy + row * p.stride[1], k, 0.0f);
  }
  r.mean = kRms ? 0.0f : p.mean[row * p.stride[3]];
  r.rstd = p.rstd[row * p.stride[4]];
}

// Vector k of the weight copied to shared memory at `sw`.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> weight(const T* sw, const RowLanes<V>& part, int k, int after) {
  return part.in(k) ? tile::load_frag<T, V>(sw + part.col(k) + after) : splat<T, V>(1.0f);
}

// dx of one row (kAdd: plus dres) and its contributions to the column sums.
template <bool kRms, bool kAdd, class T, int V, int VPT>
__device__ __forceinline__ void backward_row(BwdRow<T, V, VPT>& cur, int64_t row, const BwdP<T, kAdd>& p,
                                             const RowLanes<V>& part, const GroupReduce<Pair>& sum, const T* sw,
                                             const ColumnSums<VPT, V>& dw, const ColumnSums<VPT, V>& db,
                                             bool want_w, bool want_b) {
  // Vectors past the row end have x = dy = 0: they add nothing to the sums below.
  Pair s{0.0f, 0.0f};
  int after = 0;
  if (p.dx) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const Frag<T, V> w = weight(sw, part, k, zero_after(cur.rstd, p.zero));
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (cur.x[k][e] - cur.mean) * cur.rstd;
        const float g = cur.dy[k][e] * (w[e] + p.w_offset);
        s.a += g;
        s.b = fmaf(g, xh, s.b);
      }
    }
    s = sum(s, 0, true);
    refresh(cur.x, s.a + s.b, p.zero);
    after = zero_after(s.a + s.b, p.zero);
  }
  const float ma = kRms ? 0.0f : s.a * p.inv_n, mb = s.b * p.inv_n;
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    if (p.dx) {
      const Frag<T, V> w = weight(sw, part, k, after);
      float g[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (cur.x[k][e] - cur.mean) * cur.rstd;
        g[e] = cur.rstd * (cur.dy[k][e] * (w[e] + p.w_offset) - ma - xh * mb);
      }
      if constexpr (kAdd) {
        const Frag<T, V> d = part.load(dres_row(p, row), k, 0.0f);
#pragma unroll
        for (int e = 0; e < V; ++e) g[e] += d[e];
      }
      part.store(p.dx + row * p.stride[2], k, pack_each<T, V>(g));
    }
    // Column sums Q elements at a time, so that few floats are live at once.
    constexpr int Q = ColumnSums<VPT, V>::Q;
#pragma unroll
    for (int j = 0; j < V / Q; ++j) {
      float gw[Q], gb[Q];
#pragma unroll
      for (int i = 0; i < Q; ++i) {
        gb[i] = cur.dy[k][j * Q + i];
        gw[i] = gb[i] * ((cur.x[k][j * Q + i] - cur.mean) * cur.rstd);
      }
      if (want_w) dw.add(k, j, gw);
      if (want_b) db.add(k, j, gb);
    }
  }
}

// One or more row groups per CTA, each with its dw (and db) plane of ColumnSums in dynamic shared
// memory, then the weight. kGs: the group size when fixed at compile time (0: p.gs); with it the
// per-vector column offsets are immediates instead of registers, which the widest rows need to
// fit in 64. kRing: each group keeps a ring of kRing rows (x and dy) in registers and loads the
// next row into a slot as soon as the slot's row is finished, so kRing - 1 rows' loads are in
// flight while one is reduced and written (kRing = 1: no prefetch). The first kRing rows are
// requested before the shared-memory setup, which their latency then covers.
template <class T, int V, int VPT, bool kRms, bool kAdd, int kRing, int kGs>
__global__ __launch_bounds__(kMaxThreads, 1) void norm_backward_kernel(const BwdP<T, kAdd> p) {
  extern __shared__ __align__(16) float dyn[];
  __shared__ Pair slots[kBarrierGroups][2][32];
  constexpr int E = VPT * V, kPlanes = kRms ? 1 : 2;
  const int gs = kGs ? kGs : p.gs, sub = threadIdx.x / gs, subs = blockDim.x / gs;
  const RowLanes<V> part{static_cast<int>(threadIdx.x) - sub * gs, gs, static_cast<int>(p.n)};
  GroupReduce<Pair> sum{slots[sub < kBarrierGroups ? sub : 0][0], gs, 1 + sub, part.t >> 5};
  const bool want_w = p.part_w != nullptr, want_b = !kRms && p.part_b != nullptr;

  const int64_t first = int64_t(blockIdx.x) * subs + sub, stride = int64_t(gridDim.x) * subs;
  BwdRow<T, V, VPT> ring[kRing];
#pragma unroll
  for (int i = 0; i < kRing; ++i)
    if (first + i * stride < p.rows) load_row<kRms>(ring[i], part, p, first + i * stride);

  const int plane = E * gs;
  const ColumnSums<VPT, V> dw(dyn + sub * kPlanes * plane, gs, part.t);
  const ColumnSums<VPT, V> db(dyn + sub * kPlanes * plane + (kPlanes - 1) * plane, gs, part.t);
  if (want_w) dw.zero();
  if (want_b) db.zero();

  // The weight (1s when there is none) is copied to shared memory once and read from there
  // where it is used: registers are for the rows.
  T* sw = reinterpret_cast<T*>(dyn + kPlanes * plane * subs);
  for (int c = threadIdx.x * V; c < part.n; c += blockDim.x * V)
    tile::store_frag<T, V>(sw + c, p.w ? tile::load_frag<T, V>(p.w + c) : splat<T, V>(1.0f));
  __syncthreads();

  for (int64_t row0 = first; row0 < p.rows; row0 += kRing * stride) {
#pragma unroll
    for (int i = 0; i < kRing; ++i) {
      const int64_t row = row0 + i * stride;
      if (row >= p.rows) break;
      backward_row<kRms, kAdd>(ring[i], row, p, part, sum, sw, dw, db, want_w, want_b);
      if (row + kRing * stride < p.rows) load_row<kRms>(ring[i], part, p, row + kRing * stride);
    }
  }

  if (!want_w && !want_b) return;  // uniform over the grid
  __syncthreads();
  const int64_t prow = int64_t(blockIdx.x) * p.ld;
  if (want_w) write_partial<VPT, V>(p.part_w + prow, dyn, kPlanes * plane, subs, gs, part.n);
  if (want_b) write_partial<VPT, V>(p.part_b + prow, dyn + plane, kPlanes * plane, subs, gs, part.n);
}

// ---- long rows ----------------------------------------------------------------------------------
// Rows too long for registers take two kernels. norm_backward_rowsums_kernel reads x and dy
// once (one CTA per row) for the two row means dx needs, ma = mean(w dy) and mb = mean(w dy
// xhat); norm_backward_cols_kernel then gives each CTA a slice of columns and a range of rows:
// each thread owns one vector of columns, reads x and dy there row after row, writes dx and
// keeps its dw/db sums in registers, and writes them as one partial row at the end. x and dy
// are read twice (5 row-sized transfers instead of 3), but nothing else is: no column sums
// read-modified-written in global memory for every row.
template <class T, int V, bool kRms>
__global__ __launch_bounds__(kStreamThreads, 2) void norm_backward_rowsums_kernel(const BwdParams<T> p) {
  // Vectors of x, dy and w per thread in flight, within 64 registers (two CTAs per SM, faster
  // than one at more registers); 16-bit ones take twice the registers as floats.
  constexpr int U = sizeof(T) == 4 ? kStreamUnroll : kStreamUnroll / 2;
  __shared__ Pair scratch[32];
  const T zero = tile::from_float<T>(0.0f), one = tile::from_float<T>(1.0f);
  const int64_t step = int64_t(blockDim.x) * V, n = p.n;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    int64_t off[5];
    row_offsets(p.stride, row, off);
    const T* xr = p.x + off[0];
    const T* dyr = p.dy + off[1];
    const float mean = kRms ? 0.0f : p.mean[off[3]], rstd = p.rstd[off[4]];
    Pair s{0.0f, 0.0f};
    for (int64_t c0 = int64_t(threadIdx.x) * V; c0 < n; c0 += U * step) {
      tile::Vec<T, V> x[U], dy[U], w[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        // n is a multiple of V (or V is 1): a vector is wholly in the row or wholly past it, and
        // no element-wise load for a partial one is compiled (its registers spilled).
        const int64_t c = c0 + u * step;
        const bool in = c < n;
        x[u] = in ? tile::load<V>(xr + c) : fill_vec<T, V>(zero);
        dy[u] = in ? tile::load<V>(dyr + c) : fill_vec<T, V>(zero);
        w[u] = in && p.w ? tile::load<V>(p.w + c) : fill_vec<T, V>(one);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = tile::to_float(dy[u][e]) * (tile::to_float(w[u][e]) + p.w_offset);
          s.a += g;
          s.b = fmaf(g, (tile::to_float(x[u][e]) - mean) * rstd, s.b);
        }
    }
    s = tile::block_reduce(s, tile::Sum{}, Pair{0.0f, 0.0f}, scratch);
    if (threadIdx.x == 0) {
      p.row_means[2 * row] = kRms ? 0.0f : s.a * p.inv_n;
      p.row_means[2 * row + 1] = s.b * p.inv_n;
    }
  }
}

// Grid (column slices of kColThreads vectors, row ranges). kColRows rows are loaded before they
// are used: 2 x kColRows vectors in flight per thread. Row r of the range goes to the same CTA
// and is added in the same order on every run, and partial row blockIdx.y holds the range's
// column sums: dw/db are deterministic.
constexpr int kColThreads = 256;
template <class T>
constexpr int kColRows = sizeof(T) == 4 ? 4 : 2;

template <class T, int V, bool kRms, bool kAdd>
__global__ __launch_bounds__(kColThreads) void norm_backward_cols_kernel(const BwdP<T, kAdd> p, int64_t rows_per_cta) {
  constexpr int R = kColRows<T>;
  const T one = tile::from_float<T>(1.0f);
  const int64_t c = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * V, n = p.n;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_cta, r1 = std::min(p.rows, r0 + rows_per_cta);
  if (c >= n) return;  // no barrier below
  // n is a multiple of V (or V is 1): the thread's vector is wholly in the row, no masked accesses.
  const tile::Vec<T, V> w = p.w ? tile::load<V>(p.w + c) : fill_vec<T, V>(one);
  float sw[V] = {}, sb[V] = {};
  for (int64_t r = r0; r < r1; r += R) {
    tile::Vec<T, V> x[R], dy[R], dr[kAdd ? R : 1];
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (r + u < r1) {
        int64_t off[5];
        row_offsets(p.stride, r + u, off);
        x[u] = tile::load<V>(p.x + off[0] + c);
        dy[u] = tile::load<V>(p.dy + off[1] + c);
        if constexpr (kAdd) dr[u] = tile::load<V>(dres_row(p, r + u) + c);
      }
    }
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (r + u >= r1) break;
      int64_t off[5];
      row_offsets(p.stride, r + u, off);
      const float mean = kRms ? 0.0f : p.mean[off[3]], rstd = p.rstd[off[4]];
      const float ma = p.dx ? p.row_means[2 * (r + u)] : 0.0f;
      const float mb = p.dx ? p.row_means[2 * (r + u) + 1] : 0.0f;
      tile::Vec<T, V> g;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xh = (tile::to_float(x[u][e]) - mean) * rstd;
        const float d = tile::to_float(dy[u][e]);
        const float gx = rstd * (d * (tile::to_float(w[e]) + p.w_offset) - ma - xh * mb);
        if constexpr (kAdd) g[e] = tile::from_float<T>(gx + tile::to_float(dr[u][e]));
        else g[e] = tile::from_float<T>(gx);
        sw[e] = fmaf(d, xh, sw[e]);
        sb[e] += d;
      }
      if (p.dx) tile::store<V>(p.dx + off[2] + c, g);
    }
  }
  const int64_t prow = int64_t(blockIdx.y) * p.ld;
#pragma unroll
  for (int e = 0; e < V; ++e) {
    if (c + e < n) {
      if (p.part_w) p.part_w[prow + c + e] = sw[e];
      if (!kRms && p.part_b) p.part_b[prow + c + e] = sb[e];
    }
  }
}

// ---- column sums ----------------------------------------------------------------------------
// dw/db = the G partial rows summed per column: a block of kSumThreads threads is split
// kSumThreads / kSplit columns x kSplit (the power of two >= G, at most kSumSplit) row slices;
// thread (x, y) adds rows y, y + kSplit, ... of its column, then the kSplit results are added in y
// order. Fixed order for a given G. Each thread loads at most ~4 values (G ~ the SM count for the
// tier kernels), all issued before the first is used: one round of L2 latency. Launched as a
// programmatic dependent of the backward kernel (launch_dependent), so that its launch overlaps
// the end of that kernel instead of following it.
template <class T, int kSplit>
__global__ __launch_bounds__(kSumThreads) void sum_partials_kernel(
    const float* __restrict__ part_w, const float* __restrict__ part_b, int groups, int64_t n,
    int64_t ld, T* __restrict__ dw, T* __restrict__ db) {
  constexpr int kCols = kSumThreads / kSplit;
  __shared__ float tile_sums[kSplit][kCols + 1];
  const float* part = blockIdx.y == 0 ? part_w : part_b;
  T* out = blockIdx.y == 0 ? dw : db;
  if (part == nullptr) return;  // the whole block
  const int64_t c = int64_t(blockIdx.x) * kCols + threadIdx.x;
  runtime::wait_for_previous_grid();
  float s = 0.0f;
  if (c < n) {
#pragma unroll 8
    for (int g = threadIdx.y; g < groups; g += kSplit) s += part[int64_t(g) * ld + c];
  }
  tile_sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float r = 0.0f;
#pragma unroll
    for (int y = 0; y < kSplit; ++y) r += tile_sums[y][threadIdx.x];
    out[c] = tile::from_float<T>(r);
  }
}

// ---- host -------------------------------------------------------------------------------------
// sum_partials_kernel with the fewest row slices that cover the G partial rows (up to kSumSplit).
template <class T, int kSplit>
void launch_sum_partials(const BwdParams<T>& p, int64_t groups, T* dw, T* db, int device, cudaStream_t stream) {
  if constexpr (kSplit < kSumSplit) {
    if (kSplit < groups) return launch_sum_partials<T, 2 * kSplit>(p, groups, dw, db, device, stream);
  }
  constexpr int kCols = kSumThreads / kSplit;
  runtime::launch_dependent(sum_partials_kernel<T, kSplit>, dim3(runtime::grid_cap(ceil_div(p.n, kCols)), 2),
                            dim3(kCols, kSplit), 0, stream, device, p.part_w, p.part_b,
                            static_cast<int>(groups), p.n, p.ld, dw, db);
}

// The kernel parameters (P: BwdP) with the `groups` partial rows of column sums a backward kernel
// writes (allocated when dw or db is wanted).
template <class P, class T>
P with_partials(const BwdArgs<T>& a, int64_t groups, cudaStream_t stream) {
  P p = a.p;
  if (a.dw || a.db) {
    *a.parts = runtime::Scratch(std::size_t(groups) * p.ld * sizeof(float) * 2, stream);
    p.part_w = a.dw ? a.parts->template as<float>() : nullptr;
    p.part_b = a.db ? a.parts->template as<float>() + groups * p.ld : nullptr;
  }
  return p;
}

// dw/db from the partial rows.
template <class T>
void sum_columns(const BwdArgs<T>& a, const BwdParams<T>& p, int64_t groups, cudaStream_t stream) {
  if (!a.dw && !a.db) return;
  launch_sum_partials<T, 1>(p, groups, a.dw, a.db, a.device, stream);
  TESSERA_LAUNCH_CHECK();
}

// Register-resident rows of (kLo, kHi] vectors: VPT vectors per thread, a ring of kRing rows per
// row group, groups of kGs threads (0: the row's vectors / VPT, in whole warps), as many groups per
// CTA as fit in 1024 threads (15 at most when they need a named barrier). One CTA per SM, so the
// grid is the number of SMs (or of row groups needed). Not built where the column sums would take
// more than 16 floats per thread and plane. Where the planes and the weight exceed the shared
// memory the GPU allows a CTA, the row goes on to long-rows: the ranges of the list do not
// overlap, so no other register tier takes it.
template <class T, int V, bool kRms, bool kAdd, int VPT, int kRing, int kGs, int kLo, int kHi>
struct Registers {
  static constexpr const char* kName = "registers";
  static constexpr const char* kWhen = "rows held in registers, column sums in shared memory";
  static constexpr bool kBuilt = VPT * V <= 16;

  struct Shape {
    int gs, subs;
    std::size_t smem;
  };
  static Shape shape(int64_t n) {
    const int gs = kGs ? kGs : round_up32(ceil_div(ceil_div(n, V), VPT));
    const int subs = std::max(1, std::min(kMaxThreads / gs, gs == 32 ? 32 : kBarrierGroups));
    const std::size_t smem = std::size_t(kRms ? 1 : 2) * VPT * V * (gs * subs) * sizeof(float) +
                             std::size_t(ceil_div(n * sizeof(T), 16) * 16);
    return {gs, subs, smem};
  }
  static bool can_implement(const BwdArgs<T>& a, const Ctx& c) {
    if constexpr (kBuilt) {
      const int64_t nv = vectors<V>(a.p.n);
      const auto kernel = reinterpret_cast<const void*>(norm_backward_kernel<T, V, VPT, kRms, kAdd, kRing, kGs>);
      return kLo < nv && nv <= kHi && shape(a.p.n).smem + runtime::static_smem_bytes(kernel) <= c.smem_optin;
    } else {
      return false;
    }
  }
  static BwdPlan<BwdP<T, kAdd>> plan(const BwdArgs<T>& a, const Ctx& c) {
    BwdPlan<BwdP<T, kAdd>> pl;
    if constexpr (kBuilt) {
      const Shape sh = shape(a.p.n);
      pl.kernel = norm_backward_kernel<T, V, VPT, kRms, kAdd, kRing, kGs>;
      pl.gs = sh.gs;
      pl.threads = sh.gs * sh.subs;
      pl.elems = VPT * V;
      pl.smem = sh.smem;
      const int nb = runtime::resident_blocks_per_sm(reinterpret_cast<const void*>(pl.kernel), pl.threads, pl.smem);
      pl.grid = std::min<int64_t>(int64_t(c.sms) * nb, ceil_div(a.p.rows, sh.subs));
    }
    return pl;
  }
  static void launch(const BwdArgs<T>& a, const BwdPlan<BwdP<T, kAdd>>& plan, cudaStream_t stream) {
    launch_backward(a, plan, stream);
  }
};

template <class T>
struct LongPlan {
  int64_t cols = 0, groups = 0, rows_per_cta = 0;  // grid of cols x groups CTAs
  std::string describe() const {
    return "row means, then " + std::to_string(cols) + " column slices x " + std::to_string(groups) +
           " row ranges of " + std::to_string(rows_per_cta) + " rows";
  }
};

// One wave of column-slice CTAs with as many row ranges as fill it (each range a partial row of
// column sums).
template <class T, int V, bool kRms, bool kAdd>
struct LongRows {
  static constexpr const char* kName = "long-rows";
  static constexpr const char* kWhen = "rows the other tiers cannot hold: x and dy read twice";
  static bool can_implement(const BwdArgs<T>&, const Ctx&) { return true; }
  static LongPlan<T> plan(const BwdArgs<T>& a, const Ctx&) {
    LongPlan<T> pl;
    const int64_t rows = a.p.rows;
    pl.cols = ceil_div(vectors<V>(a.p.n), kColThreads);
    const int64_t slots =
        runtime::resident_ctas(reinterpret_cast<const void*>(norm_backward_cols_kernel<T, V, kRms, kAdd>), kColThreads);
    const int64_t ranges = std::clamp<int64_t>(slots / pl.cols, 1, std::min<int64_t>(rows, 65535));
    pl.rows_per_cta = ceil_div(rows, ranges);
    pl.groups = ceil_div(rows, pl.rows_per_cta);
    return pl;
  }
  static void launch(const BwdArgs<T>& a, const LongPlan<T>& pl, cudaStream_t stream) {
    BwdP<T, kAdd> p = with_partials<BwdP<T, kAdd>>(a, pl.groups, stream);
    if (p.dx) {
      *a.means = runtime::Scratch(std::size_t(p.rows) * 2 * sizeof(float), stream);
      p.row_means = a.means->template as<float>();
      norm_backward_rowsums_kernel<T, V, kRms>
          <<<runtime::grid_cap(p.rows), kStreamThreads, 0, stream>>>(static_cast<const BwdParams<T>&>(p));
      TESSERA_LAUNCH_CHECK();
    }
    norm_backward_cols_kernel<T, V, kRms, kAdd>
        <<<dim3(runtime::grid_cap(pl.cols), static_cast<unsigned>(pl.groups)), kColThreads, 0, stream>>>(
            p, pl.rows_per_cta);
    TESSERA_LAUNCH_CHECK();
    sum_columns(a, p, pl.groups, stream);
  }
};

template <class T, int V, bool kRms, bool kAdd>
void backward_tiers(const char* op, const BwdArgs<T>& a, const Ctx& ctx, cudaStream_t stream) {
  // Registers<T, V, kRms, kAdd, VPT, ring, fixed group size, (lo, hi] vectors per row>
  if constexpr (V > 1) {
    runtime::run_first<Staged<T, V, kRms, kAdd, 32>, Staged<T, V, kRms, kAdd, 16>,
                       Registers<T, V, kRms, kAdd, 1, 2, 0, 0, kMaxThreads / 4>,
                       Registers<T, V, kRms, kAdd, 2, 1, 0, kMaxThreads / 4, kMaxThreads>,
                       Registers<T, V, kRms, kAdd, 2, 2, kMaxThreads, kMaxThreads, 2 * kMaxThreads>,
                       Registers<T, V, kRms, kAdd, 4, 1, kMaxThreads, 2 * kMaxThreads, 4 * kMaxThreads>,
                       LongRows<T, V, kRms, kAdd>>(op, a, ctx, stream);
  } else {
    runtime::run_first<Registers<T, 1, kRms, kAdd, 1, 2, 0, 0, kMaxThreads>,
                       Registers<T, 1, kRms, kAdd, 4, 2, 0, kMaxThreads, 4 * kMaxThreads>,
                       Registers<T, 1, kRms, kAdd, 8, 1, kMaxThreads, 4 * kMaxThreads, 8 * kMaxThreads>,
                       LongRows<T, 1, kRms, kAdd>>(op, a, ctx, stream);
  }
}

// a.p.dres (add_*_norm's gradient of residual_out) takes kernels of its own.
template <class T, int V, bool kRms>
void backward_v(const char* op, const BwdArgs<T>& a, const Ctx& ctx, cudaStream_t stream) {
  if (a.p.dres) backward_tiers<T, V, kRms, true>(op, a, ctx, stream);
  else backward_tiers<T, V, kRms, false>(op, a, ctx, stream);
}

}  // namespace

template <class P, class T>
void launch_backward(const BwdArgs<T>& a, const BwdPlan<P>& plan, cudaStream_t stream) {
  P p = with_partials<P>(a, plan.grid, stream);
  p.gs = plan.gs;
  p.stages = plan.stages;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(plan.kernel), plan.smem);
  plan.kernel<<<runtime::grid_cap(plan.grid), plan.threads, plan.smem, stream>>>(p);
  TESSERA_LAUNCH_CHECK();
  sum_columns(a, p, plan.grid, stream);
}

template <class T>
void backward(const char* op, const BwdArgs<T>& a, bool rms, bool vec, const Ctx& ctx, cudaStream_t stream) {
  constexpr int V = tile::kVec16<T>;
  if (rms) vec ? backward_v<T, V, true>(op, a, ctx, stream) : backward_v<T, 1, true>(op, a, ctx, stream);
  else vec ? backward_v<T, V, false>(op, a, ctx, stream) : backward_v<T, 1, false>(op, a, ctx, stream);
}

}  // namespace tessera::norm
