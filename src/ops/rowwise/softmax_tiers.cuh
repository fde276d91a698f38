// softmax's host side: the tiers (warp, block, cluster, split, column, gathered) and run(), which
// picks the first that can take a call. Included only by the per-dtype translation units
// (softmax_f32.cu, softmax_f16.cu, softmax_bf16.cu), each of which instantiates run() for the four
// operators: a build's cores share the kernels, and softmax.cu compiles none of them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <string>

#include "ops/rowwise/softmax.cuh"
#include "runtime/device.hpp"
#include "runtime/launch.cuh"
#include "runtime/layout.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "tessera/ops/elementwise.hpp"

namespace tessera::softmax_detail {

// ---- host: the tiers ------------------------------------------------------------------------------
// Fewer rows than this on the column tier leave too few threads: gather instead.
constexpr int64_t kColumnMinRows = 16384;

using runtime::ceil_div;
using runtime::grid_cap;

// Threads for nv vectors at vpt per thread: a whole number of warps.
inline int threads_for(int64_t nv, int vpt) { return static_cast<int>(std::max<int64_t>(1, ceil_div(nv, 32LL * vpt)) * 32); }

// One call as the tiers see it: the kernel arguments, the tensors, and the layout facts they
// choose by.
template <class Op, class T>
struct Call {
  RowArgs<T, Op::kIn> a;
  TensorView out;
  std::array<TensorView, Op::kIn> in;
  int d = 0;           // the reduced dimension
  bool dense = false;  // it is dense (stride 1) in every tensor
  bool vec = false;    // rows share one misalignment: 16-byte vectors through aligned frames
  int64_t nv = 0;      // the row's 16-byte vectors in its frame (elements when !vec)
  bool coalesced = false;  // not dense, but enough rows, adjacent in memory, for the column tier
  int device = 0;
  mutable int cluster_searched = 0;  // the cluster tier's choice, made once per call
  mutable int cluster_threads = 0, cluster_size = 0;
};

struct RowsPlan {
  int vpt = 1, threads = 0, cluster = 1;
  std::string describe() const {
    return std::to_string(vpt) + " vectors per thread, " +
           (cluster > 1 ? "clusters of " + std::to_string(cluster) + " x " : "CTAs of ") +
           std::to_string(threads) + " threads";
  }
};

// Launches the row kernel: the warp tier and CTAs of under 128 threads as persistent grids (at most
// one wave of resident CTAs, each looping over rows: a row of a few KB takes less time to move than
// a CTA takes to launch and retire); larger CTAs one per row, so that a new CTA starts loading as
// soon as one retires.
template <class Op, class T, int V, int VPT, Scope K>
void launch_rows(const RowArgs<T, Op::kIn>& a, const RowsPlan& p, cudaStream_t s) {
  auto* kernel = rows_kernel<Op, T, V, VPT, K>;
  const void* fn = reinterpret_cast<const void*>(kernel);
  if constexpr (K == Scope::warp) {
    const int64_t ctas = std::min<int64_t>(ceil_div(a.rows, kWarpCtaThreads / 32), runtime::resident_ctas(fn, kWarpCtaThreads));
    kernel<<<grid_cap(ctas), kWarpCtaThreads, 0, s>>>(a, 1);
  } else if constexpr (K == Scope::block) {
    const int64_t ctas = p.threads >= 128 ? a.rows : std::min<int64_t>(a.rows, runtime::resident_ctas(fn, p.threads));
    kernel<<<grid_cap(ctas), p.threads, 0, s>>>(a, 1);
  } else {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(a.rows, INT_MAX / p.cluster) * p.cluster);
    runtime::launch_cluster(kernel, dim3(grid), dim3(p.threads), 0, p.cluster, s, a, p.cluster);
  }
  TESSERA_LAUNCH_CHECK();
}

template <class Op, class T>
struct WarpTier {
  static constexpr const char* kName = "warp";
  static constexpr const char* kWhen = "dense rows of <= 32 x VPT vectors: a warp per row, 4 rows per CTA";
  static bool can_implement(const Call<Op, T>& c, const cudaDeviceProp&) { return c.dense && c.vec && c.nv <= 32LL * kVpt<Op>; }
  // VPT: the smallest power of two covering the row, so short rows cost few registers.
  static RowsPlan plan(const Call<Op, T>& c, const cudaDeviceProp&) {
    RowsPlan p{1, kWarpCtaThreads, 1};
    while (32LL * p.vpt < c.nv) p.vpt *= 2;
    return p;
  }
  static void launch(const Call<Op, T>& c, const RowsPlan& p, cudaStream_t s) {
    constexpr int V = tile::kVec16<T>;
    switch (p.vpt) {
      case 1: return launch_rows<Op, T, V, 1, Scope::warp>(c.a, p, s);
      case 2: return launch_rows<Op, T, V, 2, Scope::warp>(c.a, p, s);
      case 4: return launch_rows<Op, T, V, 4, Scope::warp>(c.a, p, s);
      default:
        if constexpr (kVpt<Op> >= 8) return launch_rows<Op, T, V, 8, Scope::warp>(c.a, p, s);
    }
  }
};

// CTAs of <= 512 threads leave >= 2 CTAs per SM, so one CTA's reduction and stores overlap
// another's loads; up to 1024 a row still stays on one SM, which beats a cluster pair's barriers.
template <class Op, class T>
struct BlockTier {
  static constexpr const char* kName = "block";
  static constexpr const char* kWhen = "dense rows one CTA of <= 1024 threads holds: a CTA per row";
  static int vpt(const Call<Op, T>& c) { return c.vec ? kVpt<Op> : kVptScalar<Op>; }
  static bool can_implement(const Call<Op, T>& c, const cudaDeviceProp&) { return c.dense && c.nv <= 1024LL * vpt(c); }
  static RowsPlan plan(const Call<Op, T>& c, const cudaDeviceProp&) { return {vpt(c), threads_for(c.nv, vpt(c)), 1}; }
  static void launch(const Call<Op, T>& c, const RowsPlan& p, cudaStream_t s) {
    if (c.vec) return launch_rows<Op, T, tile::kVec16<T>, kVpt<Op>, Scope::block>(c.a, p, s);
    launch_rows<Op, T, 1, kVptScalar<Op>, Scope::block>(c.a, p, s);
  }
};

// A row split over a cluster of C = 2..16 CTAs (sm_90), each holding a contiguous chunk; the
// (max, sum) pairs meet through distributed shared memory, so the row is still read once. CTAs of
// <= 512 threads first (two per SM), then up to 1024; a size is taken when its resident clusters
// fill at least a quarter of the GPU's thread slots. An op whose reduction reads fewer inputs
// than its output (log_softmax backward: grad_out alone) costs 4 row lengths on the split tier
// against 3 here, and clusters of 16 move so little of the copy rate that the split tier wins.
template <class Op, class T>
struct ClusterTier {
  static constexpr const char* kName = "cluster";
  static constexpr const char* kWhen = "dense rows over one CTA, sm_90, when enough clusters fit: a cluster per row";
  static RowsPlan choose(const Call<Op, T>& c, const cudaDeviceProp& prop) {
    constexpr int kV = kVpt<Op>;
    const void* fn = reinterpret_cast<const void*>(rows_kernel<Op, T, tile::kVec16<T>, kV, Scope::cluster>);
    for (int max_threads : {512, 1024})
      for (int cl : {2, 4, 8, 16}) {
        if (max_threads > kClusterMaxThreads<T> || c.nv > int64_t(cl) * max_threads * kV) continue;
        if (Op::kReduceIn < Op::kIn && cl == 16) continue;
        const int threads = threads_for(ceil_div(c.nv, cl), kV);
        const int active = runtime::active_clusters(fn, cl, threads, c.device);
        if (active > 0 && int64_t(active) * cl * threads >= int64_t(prop.multiProcessorCount) * 512)
          return {kV, threads, cl};
      }
    return {kV, 0, 0};  // none fits
  }
  static RowsPlan chosen(const Call<Op, T>& c, const cudaDeviceProp& prop) {
    if (!c.cluster_searched) {
      const RowsPlan p = choose(c, prop);
      c.cluster_searched = 1;
      c.cluster_threads = p.threads;
      c.cluster_size = p.cluster;
    }
    return {kVpt<Op>, c.cluster_threads, c.cluster_size};
  }
  static bool can_implement(const Call<Op, T>& c, const cudaDeviceProp& prop) {
    return c.dense && c.vec && prop.major >= 9 && chosen(c, prop).cluster > 0;
  }
  static RowsPlan plan(const Call<Op, T>& c, const cudaDeviceProp& prop) { return chosen(c, prop); }
  static void launch(const Call<Op, T>& c, const RowsPlan& p, cudaStream_t s) {
    launch_rows<Op, T, tile::kVec16<T>, kVpt<Op>, Scope::cluster>(c.a, p, s);
  }
};

struct SplitPlan {
  bool vec = false;
  int64_t parts = 1, span = 0;  // parts per row, frame columns per part
  std::string describe() const {
    return std::to_string(parts) + " parts of " + std::to_string(span) + " columns per row, CTAs of " +
           std::to_string(kSplitThreads) + " threads, 2 kernels";
  }
};

// Any dense row, any GPU: kernel 1 streams each (row, part) into a partial accumulator in scratch,
// kernel 2 merges the row's partials in a fixed order and streams its part out (three passes
// over the row instead of two).
template <class Op, class T>
struct SplitTier {
  static constexpr const char* kName = "split";
  static constexpr const char* kWhen = "dense rows too long for a CTA or a cluster: two kernels over row parts";
  static bool can_implement(const Call<Op, T>& c, const cudaDeviceProp&) { return c.dense; }
  // Enough (row, part) CTAs for two waves at two CTAs per SM; a part is at least one iteration.
  static SplitPlan plan(const Call<Op, T>& c, const cudaDeviceProp& prop) {
    const int V = c.vec ? tile::kVec16<T> : 1;
    const int64_t step = int64_t(kSplitThreads) * (c.vec ? kSplitVpt<Op> : kSplitVptScalar<Op>);
    const int64_t iters = ceil_div(c.nv, step);
    const int64_t want = std::min(iters, std::max<int64_t>(1, ceil_div(4LL * prop.multiProcessorCount, c.a.rows)));
    const int64_t per = ceil_div(iters, want);
    return {c.vec, ceil_div(iters, per), per * step * V};
  }
  template <int V, int U>
  static void run(const RowArgs<T, Op::kIn>& a, const SplitPlan& p, cudaStream_t s) {
    using Acc = typename Op::Acc;
    runtime::Scratch partial(static_cast<std::size_t>(a.rows * p.parts) * sizeof(Acc), s);
    const unsigned grid = grid_cap(a.rows * p.parts);
    split_reduce_kernel<Op, T, V, U><<<grid, kSplitThreads, 0, s>>>(a, p.parts, p.span, partial.as<Acc>());
    TESSERA_LAUNCH_CHECK();
    split_write_kernel<Op, T, V, U><<<grid, kSplitThreads, 0, s>>>(a, p.parts, p.span, partial.as<Acc>());
    TESSERA_LAUNCH_CHECK();
  }
  static void launch(const Call<Op, T>& c, const SplitPlan& p, cudaStream_t s) {
    if (p.vec) return run<tile::kVec16<T>, kSplitVpt<Op>>(c.a, p, s);
    run<1, kSplitVptScalar<Op>>(c.a, p, s);
  }
};

struct GridPlan {
  unsigned grid = 1;
  std::string describe() const { return std::to_string(grid) + " CTAs of " + std::to_string(kColumnThreads) + " threads"; }
};

// The reduced dimension strided, many rows with their innermost dimension dense: one thread per
// row; adjacent threads take adjacent rows, so accesses coalesce.
template <class Op, class T>
struct ColumnTier {
  static constexpr const char* kName = "column";
  static constexpr const char* kWhen = "reduced dimension strided, >= 16384 rows adjacent in memory: a thread per row";
  static bool can_implement(const Call<Op, T>& c, const cudaDeviceProp&) { return !c.dense && c.coalesced; }
  static GridPlan plan(const Call<Op, T>& c, const cudaDeviceProp& prop) {
    return {grid_cap(std::min<int64_t>(ceil_div(c.a.rows, kColumnThreads), 32LL * prop.multiProcessorCount))};
  }
  static void launch(const Call<Op, T>& c, const GridPlan& p, cudaStream_t s) {
    columns_kernel<Op, T><<<p.grid, kColumnThreads, 0, s>>>(c.a);
    TESSERA_LAUNCH_CHECK();
  }
};

// t without dimension d (a 0-d view when t is 1-d).
inline TensorView drop_dim(const TensorView& t, int d) {
  TensorView r = t;
  r.ndim = t.ndim - 1;
  for (int i = d; i < r.ndim; ++i) {
    r.shape[i] = t.shape[i + 1];
    r.strides[i] = t.strides[i + 1];
  }
  return r;
}

// t with dimension d moved last.
inline TensorView move_last(const TensorView& t, int d) {
  TensorView r = drop_dim(t, d);
  r.ndim = t.ndim;
  r.shape[r.ndim - 1] = t.shape[d];
  r.strides[r.ndim - 1] = t.strides[d];
  return r;
}

struct NoPlan {
  std::string describe() const { return "contiguous copies, then the tier below"; }
};

// Any layout: contiguous copies with `d` last, a dense tier on them (in place), and back.
template <class Op, class T>
struct GatheredTier {
  static constexpr const char* kName = "gathered";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const Call<Op, T>&, const cudaDeviceProp&) { return true; }
  static NoPlan plan(const Call<Op, T>&, const cudaDeviceProp&) { return {}; }
  static void launch(const Call<Op, T>& c, const NoPlan&, cudaStream_t s) {
    constexpr int NIN = Op::kIn;
    const TensorView po = move_last(c.out, c.d);
    const std::size_t bytes = (static_cast<std::size_t>(c.out.numel()) * sizeof(T) + 255) / 256 * 256;
    runtime::Scratch buf(bytes * NIN, s);
    std::array<TensorView, NIN> dense;
    for (int k = 0; k < NIN; ++k) {
      dense[k] = TensorView::make(buf.as<char>() + k * bytes, c.out.dtype, po.shape, nullptr, po.ndim, c.out.device);
      tessera::copy(move_last(c.in[k], c.d), dense[k], s);
    }
    run<Op, T>(dense[0], dense, po.ndim - 1, s);
    tessera::copy(dense[0], po, s);
  }
};

// True when every tensor's rows start at the same offset modulo 16 bytes (one lead for all).
template <class T, int NT>
bool congruent_rows(const tile::StridedIndexer<NT>& idx, const void* const (&ptrs)[NT]) {
  constexpr int V = tile::kVec16<T>;
  for (int t = 1; t < NT; ++t) {
    if (reinterpret_cast<uintptr_t>(ptrs[t]) % 16 != reinterpret_cast<uintptr_t>(ptrs[0]) % 16) return false;
    for (int d = 0; d < idx.ndim; ++d)
      if ((idx.strides[t][d] - idx.strides[0][d]) % V != 0) return false;
  }
  return true;
}

// The layout facts of a call; the tiers choose by them.
template <class Op, class T>
void classify(Call<Op, T>& c) {
  constexpr int NIN = Op::kIn, V = tile::kVec16<T>;
  const auto& a = c.a;
  if (!c.dense) {
    c.coalesced = a.rows >= kColumnMinRows;
    for (int k = 0; k < NIN; ++k) c.coalesced = c.coalesced && a.idx.strides[k + 1][a.idx.ndim - 1] == 1;
    return;
  }
  const void* ptrs[NIN + 1] = {a.out};
  for (int k = 0; k < NIN; ++k) ptrs[k + 1] = a.in[k];
  c.vec = congruent_rows<T>(a.idx, ptrs);
  bool aligned = reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  for (int d = 0; d < a.idx.ndim; ++d) aligned = aligned && a.idx.strides[0][d] % V == 0;
  c.nv = !c.vec ? a.n : ceil_div(aligned ? a.n : a.n + V - 1, V);
}

template <class Op, class T>
void run(const TensorView& out, const std::array<TensorView, Op::kIn>& in, int d, cudaStream_t s) {
  constexpr int NIN = Op::kIn;
  Call<Op, T> c{};
  c.out = out;
  c.in = in;
  c.d = d;
  c.device = out.device.index;
  RowArgs<T, NIN>& a = c.a;
  a.out = static_cast<T*>(out.data);
  a.n = out.shape[d];
  a.rows = out.numel() / a.n;
  a.stride[0] = out.strides[d];
  TensorView rows[NIN + 1] = {drop_dim(out, d)};
  std::array<const TensorView*, NIN + 1> views{&rows[0]};
  c.dense = a.n == 1 || out.strides[d] == 1;
  for (int k = 0; k < NIN; ++k) {
    a.in[k] = static_cast<const T*>(in[k].data);
    a.stride[k + 1] = in[k].strides[d];
    c.dense = c.dense && (a.n == 1 || in[k].strides[d] == 1);
    rows[k + 1] = drop_dim(in[k], d);
    views[k + 1] = &rows[k + 1];
  }
  a.idx = runtime::make_indexer<NIN + 1>(views);
  classify(c);
  runtime::run_first<WarpTier<Op, T>, BlockTier<Op, T>, ClusterTier<Op, T>, SplitTier<Op, T>, ColumnTier<Op, T>,
                     GatheredTier<Op, T>>(Op::kName, c, runtime::device_props(c.device), s);
}

}  // namespace tessera::softmax_detail
