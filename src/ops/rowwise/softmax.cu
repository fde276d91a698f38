// softmax and log_softmax over one dimension, forward and backward, with torch's semantics.
//
// Bytes: forward reads x and writes out once, 2 * rows * N * sizeof(T); backward reads grad_out
// and y and writes grad_in, 3 * rows * N * sizeof(T). The arithmetic (two MUFU exps and ~10 other
// instructions per element) is far under the memory time, so the design is about moving each byte
// exactly once with enough of them in flight.
//
// Row path (the reduced dimension dense in every tensor). A group of threads holds a whole row in
// registers, packed in the storage type: one read from HBM, then the thread's max (taken in the
// storage type), its sum of exp(x - max), ONE group reduction of the (max, sum) pair, and
// exp(x - M) / S written from the same registers. Each thread holds at most 128 bytes of row data
// (VPT = 8 vectors of 16 bytes forward, 4 + 4 backward), which keeps every kernel at <= 64
// registers with no spills (ptxas: 40-64; log_softmax's 16-bit cluster kernel alone is bounded at
// one CTA per SM instead, see kClusterMaxThreads): 1024 threads x 128 B = 128 KB of loads in flight per SM
// against the ~32 KB that Little's law asks (4.2 TB/s x ~1 us / 132 SMs). Groups, by the row's
// length nv in 16-byte vectors (fp32 N / 4, 16-bit N / 8):
//   nv <= 32 * VPT   one warp per row, 4 rows per 128-thread CTA, no block barrier; VPT is the
//                    smallest power of two covering the row, so short rows cost few registers and
//                    many CTAs stay resident (4096 x 256 is one wave).
//   nv <= 512 * VPT  one CTA per row of nv / VPT threads (rounded to 32): CTAs of <= 512 threads
//                    leave >= 2 CTAs per SM, so one CTA's reduction and stores overlap another's
//                    loads.
//   sm_90, longer    a cluster of C = 2..16 CTAs of <= 512 threads per row, each holding a
//                    contiguous chunk; the pair is combined through distributed shared memory
//                    (tile::cluster_reduce), so a 1 MB fp32 row is still read once. C = 16 needs
//                    the non-portable cluster size and is taken only when the occupancy query says
//                    enough such clusters fit; otherwise CTAs of up to 1024 threads.
//   otherwise        split: kernel 1 streams each (row, part) into a partial pair in scratch,
//                    kernel 2 merges the row's pairs in a fixed order and streams its part out
//                    (three passes instead of two; any N, and sm_80).
// Rows whose start is not 16-byte aligned (odd N) still use 16-byte vectors through an aligned
// frame (row_lead) when all tensors share the misalignment. Otherwise V = 1: a CTA per row of up
// to 1024 threads x 16 elements (8 backward), split beyond.
// Every launch is planned on the host from N, the dtype and the device; nothing is tuned at run
// time except the occupancy query that admits a cluster size (cached per kernel and size).
//
// Configurations for the bench shapes (forward; fp32 | bf16), H200, 132 SMs:
//   4096 x 256     warp VPT 2 | 1: 1024 CTAs, all resident at once; 8 | 4 MB, latency-bound.
//   4096 x 1024    warp VPT 8 | 4: 32 rows per SM resident = one wave; 128 | 64 KB in flight.
//   4096 x 4096    CTA 128 | 64 threads, VPT 8: 8 | 16 CTAs per SM, 16 KB | 8 KB rows, ~4 | 2 waves.
//   4096 x 16384   CTA 512 | 256 threads, VPT 8: 2 | 4 CTAs per SM, 15.5 | 7.8 waves.
//   2048 x 32768   cluster 2 x 512 | CTA 512, VPT 8: 2 CTAs per SM.
//   256 x 262144   cluster 16 x 512 (2 per SM; 8 x 1024 if 16 does not fit) | cluster 8 x 512
//                  (log_softmax 16-bit: split).
//                  These clusters move only ~50-60% of the copy rate (ncu, fp32: 48% of DRAM
//                  peak, barrier and membar stalls; each CTA loads, waits at the cluster barrier,
//                  then stores). A persistent, TMA-prefetching form was slower (worklog).
// With 4096 rows the last wave is partial, but it is bandwidth- not slot-bound (>= 900 rows in
// flight), so the quantization costs about one row time at the end, a few percent at most.
// Backward uses VPT 4 per tensor: the warp path to nv <= 128, CTAs of <= 512 threads to nv <= 2048,
// clusters beyond (4096 x 16384 fp32: cluster 2 x 512); log_softmax backward takes the split path
// where it would need a cluster of 16 (its split reduction reads grad_out alone: see plan_rows).
//
// Strided layouts. When the reduced dimension is not dense but many rows are (>= 16384, the
// innermost row dimension dense), one thread per row streams the online (max, sum) over the row,
// then writes in a second pass; adjacent threads take adjacent rows, so accesses coalesce. Any
// other layout is gathered to contiguous scratch memory (tessera::copy), done on the row path and
// copied back.
//
// Semantics: -inf gives 0; a row of all -inf, or with a NaN or a +inf, gives NaN (the max is +inf
// and exp(inf - inf) enters the sum, as in torch's max-then-sum kernels).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>

#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/rowwise.hpp"
#include "tile/row.cuh"

namespace tessera {
namespace {

using tile::Frag;
using tile::pack;

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
#pragma unroll
    for (int e = 0; e < V; ++e) sv[e] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) sv[e] += tile::fast_exp(in[0][u][e] - base);
    float s = a.m == m ? a.s : a.s * tile::fast_exp(a.m - m);
#pragma unroll
    for (int e = 0; e < V; ++e) s += sv[e];
    return {m, s};
  }
};

template <bool Log>
struct SoftmaxOp : SoftmaxForward {
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
#pragma unroll
    for (int e = 0; e < V; ++e) sv[e] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float g = in[0][u][e];
        sv[e] = Log ? sv[e] + g : fmaf(g, in[1][u][e], sv[e]);
      }
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
// allow, the compiler takes them, only half the SMs' thread slots fill, and plan_rows turns the
// cluster down for the three-pass split path (measured, bf16 256 x 262144: softmax 123.6 ->
// 113.5 us, softmax backward 172.6 -> 141.0 us with 64). log_softmax's 16-bit forward spills at
// 64, so it keeps the bound of one CTA per SM, and with it the split path.
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

// ---- host: plans and launches -----------------------------------------------------------------------
constexpr int64_t kColumnMinRows = 16384;  // fewer rows than this: gather instead (too few threads)

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
unsigned grid_cap(int64_t blocks) { return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, INT_MAX)); }
// Threads for nv vectors at vpt per thread: a whole number of warps.
int threads_for(int64_t nv, int vpt) { return static_cast<int>(std::max<int64_t>(1, ceil_div(nv, 32LL * vpt)) * 32); }

enum class Path { warp, block, cluster, split };

struct RowPlan {
  Path path = Path::split;
  bool vec = false;  // 16-byte vectors (else V = 1)
  int vpt = 0;
  int threads = 0;
  int cluster = 1;
  int64_t parts = 1, span = 0;  // split path
};

// How many clusters of `cluster` CTAs of `threads` fit on the device at once; 0 where the kernel
// cannot be launched as a cluster: the size does not fit, or the kernel was not compiled for sm_90
// (ptxVersion: code JIT-compiled from compute_80 PTX on an sm_90 GPU still holds the trap).
int active_clusters(const void* fn, int cluster, int threads, int device) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(fn, cluster, threads, device);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int n = 0;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, fn) == cudaSuccess && fa.ptxVersion >= 90 && fa.binaryVersion >= 90 &&
      (cluster <= 8 || cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess)) {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(cluster);
    cfg.blockDim = dim3(threads);
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) n = 0;
  }
  (void)cudaGetLastError();  // a refused query is an answer (no clusters), not an error to report
  cache[key] = n;
  return n;
}

RowPlan split_plan(int64_t rows, int64_t nv, int vpt, int V, bool vec, int sms) {
  RowPlan p;
  p.path = Path::split;
  p.vec = vec;
  p.vpt = vpt;
  p.threads = kSplitThreads;
  const int64_t step = int64_t(kSplitThreads) * vpt;  // vectors per CTA iteration
  const int64_t iters = ceil_div(nv, step);
  // Enough (row, part) CTAs for two waves at two CTAs per SM; a part is at least one iteration.
  const int64_t want = std::min(iters, std::max<int64_t>(1, ceil_div(4LL * sms, rows)));
  const int64_t per = ceil_div(iters, want);
  p.parts = ceil_div(iters, per);
  p.span = per * step * V;
  return p;
}

// nv: the row's 16-byte vectors in its frame (elements when !vec).
template <class Op, class T>
RowPlan plan_rows(int64_t rows, int64_t nv, bool vec, int device);


// CTAs of `kernel` at `threads` that fit on the device at once.
template <class K>
int resident_ctas(K* kernel, int threads) {
  int device = 0;
  TESSERA_CUDA_CHECK(cudaGetDevice(&device));
  return runtime::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), threads) *
         runtime::device_props(device).multiProcessorCount;
}

// The warp path, and blocks of under 128 threads, run persistent grids (at most one wave of
// resident CTAs, each looping over rows): a row of a few KB takes less time to move than a CTA
// takes to launch and retire (bf16 4096 x 4096 on 64-thread CTAs: 62% of copy one CTA per row,
// 66% persistent).
template <class Op, class T, int V, int VPT, Scope K>
void launch_rows(const RowArgs<T, Op::kIn>& a, int threads, int cluster, cudaStream_t s) {
  auto* kernel = rows_kernel<Op, T, V, VPT, K>;
  if constexpr (K == Scope::warp) {
    const int64_t ctas = std::min<int64_t>(ceil_div(a.rows, kWarpCtaThreads / 32),
                                           resident_ctas(kernel, kWarpCtaThreads));
    kernel<<<grid_cap(ctas), kWarpCtaThreads, 0, s>>>(a, 1);
  } else if constexpr (K == Scope::block) {
    // Measured: CTAs of >= 128 threads do better one per row (a new CTA starts loading as soon as
    // one retires), smaller ones persistent.
    const int64_t ctas = threads >= 128 ? a.rows
                         : std::min<int64_t>(a.rows, resident_ctas(kernel, threads));
    kernel<<<grid_cap(ctas), threads, 0, s>>>(a, 1);
  } else {
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(a.rows, INT_MAX / cluster) * cluster));
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    TESSERA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, a, cluster));
  }
  TESSERA_LAUNCH_CHECK();
}

template <class Op, class T, int V, int U>
void launch_split(const RowArgs<T, Op::kIn>& a, const RowPlan& p, cudaStream_t s) {
  using Acc = typename Op::Acc;
  runtime::Scratch partial(static_cast<std::size_t>(a.rows * p.parts) * sizeof(Acc), s);
  const unsigned grid = grid_cap(a.rows * p.parts);
  split_reduce_kernel<Op, T, V, U><<<grid, kSplitThreads, 0, s>>>(a, p.parts, p.span, partial.as<Acc>());
  TESSERA_LAUNCH_CHECK();
  split_write_kernel<Op, T, V, U><<<grid, kSplitThreads, 0, s>>>(a, p.parts, p.span, partial.as<Acc>());
  TESSERA_LAUNCH_CHECK();
}

template <class Op, class T>
RowPlan plan_rows(int64_t rows, int64_t nv, bool vec, int device) {
  constexpr int V = tile::kVec16<T>, kV = kVpt<Op>, kS = kVptScalar<Op>;
  const cudaDeviceProp& prop = runtime::device_props(device);
  RowPlan p;
  p.vec = vec;
  if (!vec) {
    if (nv > 1024LL * kS) return split_plan(rows, nv, kSplitVptScalar<Op>, 1, false, prop.multiProcessorCount);
    p.path = Path::block;
    p.vpt = kS;
    p.threads = threads_for(nv, kS);
    return p;
  }
  if (nv <= 32LL * kV) {
    p.path = Path::warp;
    p.vpt = 1;
    while (32LL * p.vpt < nv) p.vpt *= 2;
    p.threads = kWarpCtaThreads;
    return p;
  }
  p.vpt = kV;
  if (nv <= 512LL * kV) {
    p.path = Path::block;
    p.threads = threads_for(nv, p.vpt);
    return p;
  }
  // A row one CTA of 1024 threads can hold stays on one SM: measured, the cluster of two 512-thread
  // CTAs (a cluster barrier pair per row) reached 2900 GB/s at 2048 x 32768 fp32.
  if (nv <= 1024LL * kV) {
    p.path = Path::block;
    p.threads = threads_for(nv, kV);
    return p;
  }
  if (prop.major >= 9) {
    // CTAs of <= 512 threads first (two per SM), then up to 1024. A size is taken when its
    // resident clusters fill at least a quarter of the GPU's thread slots. An op whose reduction
    // reads fewer inputs than its output (log_softmax backward: grad_out alone) reads 4 row
    // lengths on the split path against 3 on a cluster; clusters of 16 move so little of the copy
    // rate that split wins there (256 x 262144: fp32 344 -> 264 us, bf16 148 -> 138), while at
    // clusters of 8 and fewer the cluster stays ahead (fp32 1024 x 65536: 217 against 261).
    const void* fn = reinterpret_cast<const void*>(rows_kernel<Op, T, V, kV, Scope::cluster>);
    for (int max_threads : {512, 1024})
      for (int c : {2, 4, 8, 16}) {
        if (max_threads > kClusterMaxThreads<T> || nv > int64_t(c) * max_threads * kV) continue;
        if (Op::kReduceIn < Op::kIn && c == 16) continue;
        const int threads = threads_for(ceil_div(nv, c), kV);
        const int active = active_clusters(fn, c, threads, device);
        if (active > 0 && int64_t(active) * c * threads >= int64_t(prop.multiProcessorCount) * 512) {
          p.path = Path::cluster;
          p.cluster = c;
          p.threads = threads;
          return p;
        }
      }
  }
  return split_plan(rows, nv, kSplitVpt<Op>, V, true, prop.multiProcessorCount);
}

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

template <class Op, class T>
void run_rows(const RowArgs<T, Op::kIn>& a, int device, cudaStream_t s) {
  constexpr int NIN = Op::kIn, V = tile::kVec16<T>, kV = kVpt<Op>, kS = kVptScalar<Op>;
  const void* ptrs[NIN + 1] = {a.out};
  for (int k = 0; k < NIN; ++k) ptrs[k + 1] = a.in[k];
  const bool vec = congruent_rows<T>(a.idx, ptrs);
  bool aligned = reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
  for (int d = 0; d < a.idx.ndim; ++d) aligned = aligned && a.idx.strides[0][d] % V == 0;
  const int64_t nv = !vec ? a.n : ceil_div(aligned ? a.n : a.n + V - 1, V);
  const RowPlan p = plan_rows<Op, T>(a.rows, nv, vec, device);
  switch (p.path) {
    case Path::warp:
      switch (p.vpt) {
        case 1: return launch_rows<Op, T, V, 1, Scope::warp>(a, p.threads, 1, s);
        case 2: return launch_rows<Op, T, V, 2, Scope::warp>(a, p.threads, 1, s);
        case 4: return launch_rows<Op, T, V, 4, Scope::warp>(a, p.threads, 1, s);
        default:
          if constexpr (kV >= 8) return launch_rows<Op, T, V, 8, Scope::warp>(a, p.threads, 1, s);
          return;
      }
    case Path::block:
      if (p.vec) return launch_rows<Op, T, V, kV, Scope::block>(a, p.threads, 1, s);
      return launch_rows<Op, T, 1, kS, Scope::block>(a, p.threads, 1, s);
    case Path::cluster:
      return launch_rows<Op, T, V, kV, Scope::cluster>(a, p.threads, p.cluster, s);
    case Path::split:
      if (p.vec) return launch_split<Op, T, V, kSplitVpt<Op>>(a, p, s);
      return launch_split<Op, T, 1, kSplitVptScalar<Op>>(a, p, s);
  }
}

// t without dimension d (a 0-d view when t is 1-d).
TensorView drop_dim(const TensorView& t, int d) {
  TensorView r = t;
  r.ndim = t.ndim - 1;
  for (int i = d; i < r.ndim; ++i) {
    r.shape[i] = t.shape[i + 1];
    r.strides[i] = t.strides[i + 1];
  }
  return r;
}

// t with dimension d moved last.
TensorView move_last(const TensorView& t, int d) {
  TensorView r = drop_dim(t, d);
  r.ndim = t.ndim;
  r.shape[r.ndim - 1] = t.shape[d];
  r.strides[r.ndim - 1] = t.strides[d];
  return r;
}

template <class Op, class T>
void run(const TensorView& out, const std::array<TensorView, Op::kIn>& in, int d, cudaStream_t s);

// Any layout: contiguous copies with `d` last, the row path on them (in place), and back.
template <class Op, class T>
void run_gathered(const TensorView& out, const std::array<TensorView, Op::kIn>& in, int d, cudaStream_t s) {
  constexpr int NIN = Op::kIn;
  const TensorView po = move_last(out, d);
  const std::size_t bytes = (static_cast<std::size_t>(out.numel()) * sizeof(T) + 255) / 256 * 256;
  runtime::Scratch buf(bytes * NIN, s);
  std::array<TensorView, NIN> dense;
  for (int k = 0; k < NIN; ++k) {
    dense[k] = TensorView::make(buf.as<char>() + k * bytes, out.dtype, po.shape, nullptr, po.ndim, out.device);
    tessera::copy(move_last(in[k], d), dense[k], s);
  }
  run<Op, T>(dense[0], dense, po.ndim - 1, s);
  tessera::copy(dense[0], po, s);
}

template <class Op, class T>
void run(const TensorView& out, const std::array<TensorView, Op::kIn>& in, int d, cudaStream_t s) {
  constexpr int NIN = Op::kIn;
  RowArgs<T, NIN> a{};
  a.out = static_cast<T*>(out.data);
  a.n = out.shape[d];
  a.rows = out.numel() / a.n;
  a.stride[0] = out.strides[d];
  TensorView rows[NIN + 1] = {drop_dim(out, d)};
  std::array<const TensorView*, NIN + 1> views{&rows[0]};
  bool dense = a.n == 1 || out.strides[d] == 1;
  for (int k = 0; k < NIN; ++k) {
    a.in[k] = static_cast<const T*>(in[k].data);
    a.stride[k + 1] = in[k].strides[d];
    dense = dense && (a.n == 1 || in[k].strides[d] == 1);
    rows[k + 1] = drop_dim(in[k], d);
    views[k + 1] = &rows[k + 1];
  }
  a.idx = runtime::make_indexer<NIN + 1>(views);
  if (dense) return run_rows<Op, T>(a, out.device.index, s);

  bool coalesced = a.rows >= kColumnMinRows;
  for (int k = 0; k < NIN; ++k) coalesced = coalesced && a.idx.strides[k + 1][a.idx.ndim - 1] == 1;
  if (!coalesced) return run_gathered<Op, T>(out, in, d, s);
  const int sms = runtime::device_props(out.device.index).multiProcessorCount;
  columns_kernel<Op, T><<<grid_cap(std::min<int64_t>(ceil_div(a.rows, kColumnThreads), 32LL * sms)),
                          kColumnThreads, 0, s>>>(a);
  TESSERA_LAUNCH_CHECK();
}

template <class Op, int NIN>
void dispatch(const TensorView& out, const std::array<TensorView, NIN>& in, int d, cudaStream_t s) {
  runtime::DeviceGuard guard(out.device.index);
  switch (out.dtype) {
    case DType::float32: return run<Op, float>(out, in, d, s);
    case DType::float16: return run<Op, __half>(out, in, d, s);
    default: return run<Op, __nv_bfloat16>(out, in, d, s);
  }
}

// ---- argument checks ----------------------------------------------------------------------------------
// dim wrapped into [0, max(ndim, 1)): a 0-d tensor has one dimension of size 1, as in torch.
int wrap_dim(const char* op, int dim, int ndim) {
  const int nd = std::max(ndim, 1);
  if (dim < -nd || dim >= nd)
    detail::throw_arg(ErrorKind::value, op, "dim",
                      "a dimension in [" + std::to_string(-nd) + ", " + std::to_string(nd - 1) +
                          "] for a " + std::to_string(ndim) + "-d tensor",
                      std::to_string(dim));
  return dim < 0 ? dim + nd : dim;
}

// A 0-d view as the 1-d view of its element.
TensorView at_least_1d(const TensorView& t) {
  if (t.ndim > 0) return t;
  TensorView r = t;
  r.ndim = 1;
  r.shape[0] = 1;
  r.strides[0] = 1;
  return r;
}

template <bool Log>
void forward(const char* op, const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  detail::check_cuda_tensor(op, "x", x);
  detail::check_dtype_in(op, "x", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "out", out, "x", x);
  const int d = wrap_dim(op, dim, x.ndim);
  detail::check_no_internal_overlap(op, "out", out);
  detail::check_no_overlap(op, "out", out, "x", x, /*allow_identical=*/true);
  if (out.numel() == 0) return;
  dispatch<SoftmaxOp<Log>, 1>(at_least_1d(out), {at_least_1d(x)}, d, stream);
}

template <bool Log>
void backward(const char* op, const TensorView& grad_out, const TensorView& y, int dim,
              const TensorView& grad_in, cudaStream_t stream) {
  detail::check_cuda_tensor(op, "grad_out", grad_out);
  detail::check_dtype_in(op, "grad_out", grad_out, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "y", y, "grad_out", grad_out);
  detail::check_like(op, "grad_in", grad_in, "grad_out", grad_out);
  const int d = wrap_dim(op, dim, grad_out.ndim);
  detail::check_no_internal_overlap(op, "grad_in", grad_in);
  detail::check_no_overlap(op, "grad_in", grad_in, "grad_out", grad_out, /*allow_identical=*/true);
  detail::check_no_overlap(op, "grad_in", grad_in, "y", y, /*allow_identical=*/false);
  if (grad_in.numel() == 0) return;
  dispatch<SoftmaxBackwardOp<Log>, 2>(at_least_1d(grad_in), {at_least_1d(grad_out), at_least_1d(y)}, d, stream);
}

}  // namespace

void softmax(const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::softmax");
  forward<false>("softmax", x, dim, out, stream);
}

void log_softmax(const TensorView& x, int dim, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::log_softmax");
  forward<true>("log_softmax", x, dim, out, stream);
}

void softmax_backward(const TensorView& grad_out, const TensorView& y, int dim,
                      const TensorView& grad_in, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::softmax_backward");
  backward<false>("softmax_backward", grad_out, y, dim, grad_in, stream);
}

void log_softmax_backward(const TensorView& grad_out, const TensorView& y, int dim,
                          const TensorView& grad_in, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::log_softmax_backward");
  backward<true>("log_softmax_backward", grad_out, y, dim, grad_in, stream);
}

}  // namespace tessera
