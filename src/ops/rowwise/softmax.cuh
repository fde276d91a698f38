// softmax and log_softmax, device side: the four operators as policies (the math) and the row
// kernels they run in. The host side: the tiers that choose among the kernels (softmax_tiers.cuh,
// instantiated per dtype in softmax_<dtype>.cu) and the public functions (softmax.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "tessera/tensor.hpp"
#include "tile/row.cuh"

namespace tessera::softmax_detail {

using tile::Frag;
using tile::pack;

// sv[e] = step(...step(step(0, 0, e), 1, e)..., U - 1, e): one accumulation chain per element
// position of the U fragments, so that consecutive steps do not wait on each other.
template <int V, int U, class Step>
__device__ __forceinline__ void lane_sums(float (&sv)[V], Step step) {
#pragma unroll
  for (int e = 0; e < V; ++e) sv[e] = 0.0f;
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int e = 0; e < V; ++e) sv[e] = step(sv[e], u, e);
}

// ---- the four operators -------------------------------------------------------------------------
// Each is a policy: kIn tensors read per element (slot 0 is the one the output may alias), a row
// accumulator Acc with its Merge and identity, add() for the fragments one thread holds, finish()
// for the per-row constants and out() for one element.

struct SoftmaxForward {
  static constexpr int kIn = 1;
  static constexpr int kReduceIn = 1;  // the leading inputs add() reads
  using Acc = tile::SoftmaxState;
  using Merge = tile::SoftmaxMerge;
  __device__ static Acc identity() { return {-INFINITY, 0.0f}; }
  template <class T> __device__ static uint32_t fill() { return tile::neg_inf_bits<T>(); }

  // The fragments' max first, then one exp each. With a max of -inf (nothing but -inf and NaN so
  // far) the exps are taken against 0, so -inf adds 0 rather than exp(-inf + inf) = NaN, and NaN
  // makes the sum NaN. A +inf max gives exp(inf - inf) = NaN for the +inf element, as in torch.
  template <int V, int U, class T>
  __device__ static Acc add(Acc a, const Frag<T, V> (&in)[1][U]) {
    const float m = tile::frag_max(in[0], a.m);
    const float base = m == -INFINITY ? 0.0f : m;
    float sv[V];
    lane_sums<V, U>(sv, [&](float acc, int u, int e) { return acc + tile::fast_exp(in[0][u][e] - base); });
    float s = a.m == m ? a.s : a.s * tile::rescale(a.m, m);
#pragma unroll
    for (int e = 0; e < V; ++e) s += sv[e];
    return {m, s};
  }
};

template <bool Log>
struct SoftmaxOp : SoftmaxForward {
  static constexpr const char* kName = Log ? "log_softmax" : "softmax";
  struct Row {
    float m;
    float c;  // 1 / sum for softmax, log(sum) for log_softmax
  };
  // The MUFU forms (a few ulp, far inside fp32's tolerance): the row's registers are all live
  // here, and the accurate logf and division need more. A row of all -inf has m = -inf, and
  // x - m is NaN below.
  __device__ static Row finish(Acc a) { return {a.m, Log ? __logf(a.s) : __fdividef(1.0f, a.s)}; }
  __device__ static float out(const Row& r, const float (&v)[1]) {
    return Log ? (v[0] - r.m) - r.c : tile::fast_exp(v[0] - r.m) * r.c;
  }
};

// Inputs: slot 0 grad_out, slot 1 y. Softmax: sum of grad_out * y; log_softmax: sum of grad_out.
template <bool Log>
struct SoftmaxBackwardOp {
  static constexpr const char* kName = Log ? "log_softmax_backward" : "softmax_backward";
  static constexpr int kIn = 2;
  static constexpr int kReduceIn = Log ? 1 : 2;  // log_softmax's sum reads grad_out alone
  using Acc = float;
  using Merge = tile::Sum;
  using Row = float;
  __device__ static Acc identity() { return 0.0f; }
  template <class T> __device__ static uint32_t fill() { return 0u; }

  template <int V, int U, class T>
  __device__ static Acc add(Acc a, const Frag<T, V> (&in)[2][U]) {
    float sv[V];
    lane_sums<V, U>(sv, [&](float acc, int u, int e) {
      const float g = in[0][u][e];
      return Log ? acc + g : fmaf(g, in[1][u][e], acc);
    });
#pragma unroll
    for (int e = 0; e < V; ++e) a += sv[e];
    return a;
  }
  __device__ static Row finish(Acc a) { return a; }
  __device__ static float out(Row sum, const float (&v)[2]) {
    return Log ? v[0] - tile::fast_exp(v[1]) * sum : v[1] * (v[0] - sum);
  }
};

// Per-thread row data, in 16-byte vectors: 128 bytes over all inputs on the vector path; on the
// scalar path (V = 1) 64 bytes of fp32.
template <class Op> inline constexpr int kVpt = 8 / Op::kIn;
template <class Op> inline constexpr int kVptScalar = 16 / Op::kIn;
// The split path streams: half of that per step is enough in flight (two 512-thread CTAs per SM).
template <class Op> inline constexpr int kSplitVpt = kVpt<Op> / 2;
template <class Op> inline constexpr int kSplitVptScalar = kVptScalar<Op> / 2;

// ---- kernels --------------------------------------------------------------------------------------
using tile::Scope;

constexpr int kWarpCtaThreads = 128;  // warp path: 4 rows per CTA
constexpr int kSplitThreads = 512;
// Cluster CTAs of 16-bit types stay at <= 512 threads, float32 may take 1024. Either way a cluster
// kernel gets 64 registers (two 512-thread CTAs per SM): with the 128 that one CTA per SM would
// allow, the compiler takes them, only half the SMs' thread slots fill, and the cluster tier
// declines the size for the three-pass split tier, which is slower. log_softmax's 16-bit forward
// spills at 64, so it keeps the bound of one CTA per SM, and with it the split tier.
template <class T>
inline constexpr int kClusterMaxThreads = sizeof(T) == 2 ? 512 : 1024;
template <class Op, class T>
inline constexpr int kClusterMinBlocks =
    sizeof(T) == 2 && std::is_same_v<Op, SoftmaxOp<true>> ? 1 : 1024 / kClusterMaxThreads<T>;
constexpr int kColumnThreads = 256;

// Slot 0 is the output, slot k + 1 input k (the map kernels' convention).
template <class T, int NIN>
struct RowArgs {
  const T* in[NIN];
  T* out;
  int64_t rows;
  int64_t n;                           // row length
  int64_t stride[NIN + 1];             // along the reduced dimension (column kernel)
  tile::StridedIndexer<NIN + 1> idx;   // over the other dimensions: where row r starts
  uint32_t zero;                       // always 0, unknown to the compiler; see apply()
};

// Replaces slot 0 of f by the outputs. `zero` (a kernel argument that is always 0) is mixed into
// 16-bit words first: it makes these conversions differ, for the compiler, from the identical ones
// in add(), which it would otherwise keep from before the group reduction, holding every element
// of the row as a float (twice the registers of the packed row, and spills).
template <class Op, int V, int U, class T>
__device__ __forceinline__ void apply(const typename Op::Row& row, Frag<T, V> (&f)[Op::kIn][U], uint32_t zero) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    Frag<T, V> x[Op::kIn];
#pragma unroll
    for (int k = 0; k < Op::kIn; ++k) {
      x[k] = f[k][u];
      tile::make_opaque(x[k], zero);
    }
    float o[V];
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float v[Op::kIn];
#pragma unroll
      for (int k = 0; k < Op::kIn; ++k) v[k] = x[k][e];
      o[e] = Op::out(row, v);
    }
    f[0][u] = pack<T, V>(o);
  }
}

// Loads the thread's U fragments of each input, or of the first `inputs` only (the split path's
// reduction skips what Op::add does not read); `at` is the chunk's first column in the frames.
template <class Op, int V, int U, class T>
__device__ __forceinline__ void load_frags(Frag<T, V> (&f)[Op::kIn][U], const RowArgs<T, Op::kIn>& a,
                                           const int64_t* off, int64_t at, const tile::Window& w, const tile::RowLanes<V>& p,
                                           int inputs = Op::kIn) {
#pragma unroll
  for (int k = 0; k < Op::kIn; ++k) {
    if (k >= inputs) break;
    const T* frame = a.in[k] + off[k + 1] + at;
#pragma unroll
    for (int u = 0; u < U; ++u) f[k][u] = tile::load_frag_window<T, V>(frame, p.col(u), w.lo, w.hi, Op::template fill<T>());
  }
}

// A thread whose vectors are all whole (every one of an aligned row's, but its ends) takes one
// test and U plain 16-byte stores; only threads at a ragged end test every vector.
template <int V, int U, class T>
__device__ __forceinline__ void store_frags(T* frame, const tile::Window& w, const tile::RowLanes<V>& p, const Frag<T, V> (&f)[U]) {
  if constexpr (V > 1) {
    if (p.col(0) >= w.lo && p.col(U - 1) + V <= w.hi) {
#pragma unroll
      for (int u = 0; u < U; ++u) tile::store_frag_16B(frame + p.col(u), f[u]);
      return;
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) tile::store_frag_window<T, V>(frame, p.col(u), w.lo, w.hi, f[u]);
}

// Row path: one row per warp, CTA or cluster (`cluster` CTAs, launched as a cluster), held in
// registers from load to store. Rows are taken grid-stride so any row count fits in the grid.
template <class Op, class T, int V, int VPT, Scope K>
__global__ void __launch_bounds__(K == Scope::warp ? kWarpCtaThreads : K == Scope::cluster ? kClusterMaxThreads<T> : 1024,
                                  K == Scope::warp ? 8 : K == Scope::cluster ? kClusterMinBlocks<Op, T> : 1)
rows_kernel(RowArgs<T, Op::kIn> a, int cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if constexpr (K == Scope::cluster) {  // clusters are sm_90's: the launcher uses them there only
    __trap();
    return;
  }
#endif
  constexpr int NIN = Op::kIn;
  using Acc = typename Op::Acc;
  __shared__ Acc scratch[32];
  __shared__ Acc slot;
  int t, G;
  int64_t first, step, base = 0;
  if constexpr (K == Scope::warp) {
    constexpr int kWarps = kWarpCtaThreads / 32;
    t = threadIdx.x & 31;
    G = 32;
    first = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    step = static_cast<int64_t>(gridDim.x) * kWarps;
  } else {
    t = threadIdx.x;
    G = blockDim.x;
    first = blockIdx.x / cluster;
    step = gridDim.x / cluster;
    if constexpr (K == Scope::cluster) base = static_cast<int64_t>(tile::cluster_rank()) * G * VPT * V;
  }
  const tile::RowLanes<V> p{t, G, 0};
  for (int64_t r = first; r < a.rows; r += step) {
    int64_t off[NIN + 1];
    tile::row_offsets(a.idx, r, off);
    const int lead = tile::row_lead<V>(a.out + off[0]);  // the same in every tensor (checked on the host)
    const tile::Window w = tile::window(base, lead, lead + a.n);
    Frag<T, V> f[NIN][VPT];
    load_frags<Op>(f, a, off, base - lead, w, p);
    T* out = a.out + off[0] + (base - lead);
    Acc acc = Op::add(Op::identity(), f);
    acc = tile::scope_reduce<K>(acc, typename Op::Merge{}, Op::identity(), scratch, &slot);
    apply<Op>(Op::finish(acc), f, a.zero);
    // The store addresses are computed afresh (from t + 0, opaque to the compiler) rather than
    // kept from the loads across the reduction: VPT 64-bit addresses would not fit beside the row.
    store_frags(out, w, tile::RowLanes<V>{t + static_cast<int>(a.zero), G, 0}, f[0]);
  }
}

// Split path, kernel 1: the accumulator of each (row, part) into partial[row * parts + part].
// A part is `span` frame columns; the CTA streams it U vectors per thread at a time.
template <class Op, class T, int V, int U>
__global__ void __launch_bounds__(kSplitThreads, 2)
split_reduce_kernel(RowArgs<T, Op::kIn> a, int64_t parts, int64_t span, typename Op::Acc* partial) {
  constexpr int NIN = Op::kIn;
  using Acc = typename Op::Acc;
  __shared__ Acc scratch[32];
  const int64_t step = static_cast<int64_t>(blockDim.x) * U * V;
  for (int64_t item = blockIdx.x; item < a.rows * parts; item += gridDim.x) {
    const int64_t r = item / parts, begin = (item - r * parts) * span;
    int64_t off[NIN + 1];
    tile::row_offsets(a.idx, r, off);
    const int lead = tile::row_lead<V>(a.out + off[0]);
    const int64_t lo = begin > lead ? begin : lead, hi = lead + a.n < begin + span ? lead + a.n : begin + span;
    const tile::RowLanes<V> p{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), 0};
    Acc acc = Op::identity();
    for (int64_t b = begin; b < hi; b += step) {
      Frag<T, V> f[NIN][U];
      load_frags<Op>(f, a, off, b - lead, tile::window(b, lo, hi), p, Op::kReduceIn);
      acc = Op::add(acc, f);
    }
    acc = tile::block_reduce(acc, typename Op::Merge{}, Op::identity(), scratch);
    if (threadIdx.x == 0) partial[item] = acc;
  }
}

// Split path, kernel 2: every CTA of a row merges the row's partials in the same fixed order (so
// all parts use bit-identical constants), then streams its part to the output.
template <class Op, class T, int V, int U>
__global__ void __launch_bounds__(kSplitThreads, 2)
split_write_kernel(RowArgs<T, Op::kIn> a, int64_t parts, int64_t span, const typename Op::Acc* partial) {
  constexpr int NIN = Op::kIn;
  using Acc = typename Op::Acc;
  __shared__ Acc scratch[32];
  const typename Op::Merge merge;
  const int64_t step = static_cast<int64_t>(blockDim.x) * U * V;
  for (int64_t item = blockIdx.x; item < a.rows * parts; item += gridDim.x) {
    const int64_t r = item / parts, begin = (item - r * parts) * span;
    Acc acc = Op::identity();
    for (int64_t i = threadIdx.x; i < parts; i += blockDim.x) acc = merge(acc, partial[r * parts + i]);
    const auto row = Op::finish(tile::block_reduce(acc, merge, Op::identity(), scratch));
    int64_t off[NIN + 1];
    tile::row_offsets(a.idx, r, off);
    T* out = a.out + off[0];
    const int lead = tile::row_lead<V>(out);
    const int64_t lo = begin > lead ? begin : lead, hi = lead + a.n < begin + span ? lead + a.n : begin + span;
    const tile::RowLanes<V> p{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), 0};
    for (int64_t b = begin; b < hi; b += step) {
      const tile::Window w = tile::window(b, lo, hi);
      Frag<T, V> f[NIN][U];
      load_frags<Op>(f, a, off, b - lead, w, p);
      apply<Op>(row, f, a.zero);
      store_frags(out + (b - lead), w, tile::RowLanes<V>{p.t + static_cast<int>(a.zero), p.G, 0}, f[0]);
    }
  }
}

// Column path: one thread per row, elements `stride` apart. Pass 1 streams the accumulator over
// the row, four elements per step for independent loads; pass 2 writes.
template <class Op, class T>
__global__ void __launch_bounds__(kColumnThreads, 4) columns_kernel(RowArgs<T, Op::kIn> a) {
  constexpr int NIN = Op::kIn, U = 4;
  const uint32_t fill = Op::template fill<T>();
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[NIN + 1];
    tile::row_offsets(a.idx, r, off);
    typename Op::Acc acc = Op::identity();
    for (int64_t c = 0; c < a.n; c += U) {
      Frag<T, 1> f[NIN][U];
#pragma unroll
      for (int k = 0; k < NIN; ++k)
#pragma unroll
        for (int u = 0; u < U; ++u)
          f[k][u].w[0] = c + u < a.n ? tile::to_bits(a.in[k][off[k + 1] + (c + u) * a.stride[k + 1]]) : fill;
      acc = Op::add(acc, f);
    }
    const auto row = Op::finish(acc);
    for (int64_t c = 0; c < a.n; ++c) {
      Frag<T, 1> f[NIN][1];
#pragma unroll
      for (int k = 0; k < NIN; ++k) f[k][0].w[0] = tile::to_bits(a.in[k][off[k + 1] + c * a.stride[k + 1]]);
      apply<Op>(row, f, 0u);
      a.out[off[0] + c * a.stride[0]] = tile::from_bits<T>(f[0][0].w[0]);
    }
  }
}

// The tiers' entry point for one operator and dtype (softmax_tiers.cuh): `out` and `in` with the
// reduced dimension `d`, which the dtype's translation unit (softmax_<dtype>.cu) instantiates.
template <class Op, class T>
void run(const TensorView& out, const std::array<TensorView, Op::kIn>& in, int d, cudaStream_t s);

}  // namespace tessera::softmax_detail
