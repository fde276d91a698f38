// LayerNorm and RMSNorm, forward and backward (torch's semantics; see tessera/ops/rowwise.hpp).
//
// ---- Bytes ----------------------------------------------------------------------------------
// Forward must read x and write out, 2 * rows * N * sizeof(T), plus N-element weight and bias
// (read by every row, but from L2/L1 after the first) and 4-byte mean and rstd per row. Backward
// must read x and dy and write dx, 3 * rows * N * sizeof(T), plus weight, the saved mean/rstd and
// the N-element dw/db. At copy bandwidth (4.2 TB/s on an H200) 4096 x 4096 bf16 is 16 us forward
// and 24 us backward, so each tensor is touched in HBM exactly once and everything else (weight,
// partial column sums) stays within a few percent of that.
//
// ---- Bytes in flight ------------------------------------------------------------------------
// An H200 SM's share of the bandwidth is ~32 B/ns; at ~1 us of loaded memory latency each SM needs
// >= 32 KB of loads outstanding, better 64 KB. A kernel that holds its row in registers has one
// row's loads outstanding per row group, so the configurations below are about how many bytes of
// row are resident per SM within 64K registers: every kernel is capped at 64 registers per
// thread (__launch_bounds__(1024, 1); 80 for the forward's VPT-4 prefetch tier; the staged
// backward, whose rows wait in shared memory, takes up to 128 in 512-thread CTAs). ptxas reports
// small spills (4-48 bytes) in a few kernels, each kept because it measured faster than the
// spill-free alternative: float32 rms_norm forward at VPT 8 in groups of 32 and the backward's
// ring-of-two tier at VPT 2 (see norm_backward_kernel). What costs registers besides the row
// itself, and how it is kept down: half-type rows stay packed two elements per 32-bit register
// (Packed); column offsets are 32-bit and, where the group size is a template constant,
// immediates (Cols); rows sit at a uniform stride (one multiply per row, no 64-bit divisions);
// and the compiler is kept from holding float copies of the row, or early weight loads, across
// a reduction (refresh, zero_after).
//
// ---- Forward (norm_forward_kernel) ----------------------------------------------------------
// The row is read once into registers (VPT vectors of V = 16 / sizeof(T) elements per thread),
// reduced (mean and squared deviations from it: no E[x^2] - E[x]^2 cancellation), normalized
// and written once. Weight and bias are read with the row's partition, two vectors at a time
// (one for 16-bit rows at VPT 8) after the reductions (L1/L2 hits). LayerNorm either sums x for the mean and then the squared
// deviations from it (two group reductions), or, where registers allow (the prefetching tiers
// below but 16-bit VPT 4), has each thread take the mean and squared deviations of its own
// elements and merges those (count, mean, M2) triples in one reduction (Chan et al.): one
// barrier round per row instead of two.
//   rows of <= 16 KB (<= 1024 vectors): one row per group leaves too little in flight (the row
//     is loaded, then nothing is loaded while it is reduced and stored), so these tiers are
//     persistent (grid = resident CTAs) and each group loads its next row into a second
//     fragment before it reduces the current one: two rows per group resident.
//     <= 64 vectors: a warp per row (shuffles only), VPT 1 or 2, four rows per CTA, <= 64
//       registers: 1024 threads and up to 64 KB of (two) rows per SM.
//     <= 1024 vectors: VPT 4 (2 x 64 B per thread), gs = N / (4 V) <= 256 threads per row,
//       reduced at a named barrier per group (groups of one CTA never wait for each other);
//       <= 80 registers (__launch_bounds__(256, 3)), 768 threads and 96 KB of rows per SM.
//       bf16 N = 1024 / 4096 (RMSNorm; LayerNorm below on sm_90): gs = 32 (four rows per CTA) / 128.
//   sm_90, float32 rows of 256..2048 vectors and 16-bit rows of 512 (LayerNorm) or 1024
//     (RMSNorm) to 2048: VPT 8 (128 B per thread), one row per group, plain grid, gs a
//     compile-time power of two of 32..256 (the column offsets of the 8 vectors are immediates).
//     More CTAs per SM and fewer threads to reduce over than the VPT 4 tiers; measured faster at
//     these lengths (see forward_v). CTAs of >= 256 threads: fp32 N = 1024 / 4096 / 8192: gs =
//     32 (eight rows per CTA) / 128 (two) / 256; bf16 N = 4096 / 8192 / 16384: 64 / 128 / 256.
//   up to 1024 x 4 vectors (the rest): VPT 4 (64 B per thread), one row per group, plain grid;
//     ~64 registers, 1024 threads and 64 KB of row per SM.
//   fp32 on sm_90, 2048 < N / 4 <= 8192 vectors: VPT 8 (128 B per thread) with gs fixed at 512
//     or 1024. fp32 N = 16384: 512 threads x 128 B, two CTAs (128 KB) per SM.
//   longer rows: norm_forward_stream_kernel, one 1024-thread CTA per SM looping over rows, each
//     read twice (reduction, then output; the second read from L2, kept there by an evict_last
//     hint on the first).
//
// ---- Backward (norm_backward_kernel + sum_partials_kernel) ----------------------------------
// dx needs two row sums, sum(w dy) and sum(w dy xhat), reduced together as a pair. dw = sum over
// rows of dy * xhat and db = sum of dy are column sums: each thread owns fixed columns and adds
// its rows' contributions to fp32 sums in shared memory (no atomics), so the kernel reads x and
// dy once for all three gradients. The grid is persistent, min(SMs x resident CTAs, row groups):
// a function of the shape and the GPU only; row r always goes to the same CTA and row group, each
// CTA adds its groups' sums in group order into one partial row [N] in scratch memory, and
// sum_partials_kernel adds the G partial rows per column in a fixed order. dw and db are
// therefore bit-identical from run to run. The partials are G x N x 8 bytes with G = #SMs: ~4%
// of the backward's bytes at 4096 rows, written and read back mostly through L2.
//   sm_90, rows whose x and dy fit three times in ~200 KB (fp32 N <= 8192, bf16 and fp16 RMSNorm
//   N <= 16384, fp16 LayerNorm N <= 8192) with the 16-byte vector path:
//   norm_backward_staged_kernel, one 512-thread CTA per SM in groups of 32..512 threads with 16
//   elements per thread (32 for those 16-bit rows over 4096), rows staged in shared memory by bulk
//   copies; its column sums stay in registers. Measured against the tiers below (tessera bench,
//   H200): layer_norm bf16 4096 / 8192 / 16384 42.0 / 77.9 / 152.4 -> 35.2 / 61.3 / 120.0 us, fp32
//   1024 / 4096 22.9 / 61.0 -> 19.7 / 55.6.
//   Elsewhere (sm_80, V = 1, longer rows) the register-resident tiers:
//   One 1024-thread CTA per SM, split into row groups of gs = N / (VPT V) threads; the weight is
//   copied to shared memory once per CTA; column sums take 2 x VPT x V floats per thread in
//   shared memory (<= 128 KB per CTA), laid out so that a warp's accesses are conflict-free.
//   tier 1, VPT 1 (bf16 N <= 2048, fp32 N <= 1024): a ring of two rows per group (the next row's x
//     and dy load while the current one is reduced and written). bf16 N = 1024: 8 groups of 128
//     threads; fp32 N = 1024: 4 of 256.
//   tier 2, VPT 2 (bf16 N <= 8192, fp32 N <= 4096): no prefetch, but half the threads per row of
//     VPT 1, so twice the groups per SM. bf16 N = 4096 / 8192: 4 groups of 256 / 2 of 512.
//   tier 3, VPT 2 (bf16 N <= 16384, fp32 N <= 8192): one group of 1024 with a ring of two rows.
//   tier 4, VPT 4 (fp32 N <= 16384): one group of 1024, no prefetch (the row, x and dy, is
//     already 128 KB per SM).
//   Longer rows (or shared memory over the GPU's per-CTA limit): two kernels, the row means
//     dx needs (norm_backward_rowsums_kernel, one CTA per row), then column slices over row
//     ranges (norm_backward_cols_kernel) with the column sums in registers: x and dy are read
//     twice.
//
// ---- Layouts --------------------------------------------------------------------------------
// The kernels need the normalized block of x/out (dy/dx) dense (stride 1 innermost, contiguous
// over the normalized dimensions) and the rows at a uniform stride (leading dimensions that
// collapse into one: any contiguous or row-sliced layout), mean/rstd likewise at a uniform
// stride. Any other layout is gathered into contiguous scratch memory with tessera::copy first
// (outputs: computed there and scattered back after), as are non-contiguous weight/bias and
// dw/db. The 16-byte vector path needs N % V == 0 and every row start 16-byte aligned;
// otherwise the same kernels run with V = 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/launch.cuh"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/rowwise.hpp"
#include "tile/bulk.cuh"
#include "tile/row.cuh"

namespace tessera {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kFwdCta = 128;           // forward: smallest CTA (4 rows of one warp each)
// Forward, VPT 8 in fixed groups (sm_90): CTAs of at least 256 threads, i.e. two rows of 128 at
// fp32 N = 4096 (tessera bench, H200: layer_norm 35.2 -> 33.7 us, rms_norm 34.5 -> 34.1 against
// one row of 128; 512 threads was slower at fp32 N = 8192 and bf16 N = 16384).
constexpr int kFwdCta8 = 256;
// Forward, VPT 4 with prefetch: CTAs of up to 256 threads, 3 per SM, i.e. up to 80 registers per
// thread (two 64-byte row fragments do not fit in 64).
constexpr int kPrefetchCta = 256, kPrefetchBlocks = 3;
constexpr int kBarrierGroups = 15;     // named barriers 1..15 (0 is __syncthreads)
constexpr int kMaxStages = 8;          // staged backward: most ring slots per row group
constexpr int kStreamThreads = 512;    // long-row backward row sums: one CTA per row
constexpr int kStreamUnroll = 4;       // vectors per thread loaded before they are used
constexpr int kSumThreads = 1024, kSumSplit = 32;  // sum_partials_kernel: block, most row slices

// ---- device helpers -------------------------------------------------------------------------
using tile::Frag;
using tile::GroupReduce;
using tile::Moments;
using tile::MergeMoments;
using tile::Pair;
using tile::RowLanes;
using tile::pack_each;
using tile::refresh;
using tile::row_offsets;
using tile::splat;
using tile::zero_after;

template <class T, int V>
__device__ __forceinline__ tile::Vec<T, V> fill_vec(T v) {
  tile::Vec<T, V> r;
#pragma unroll
  for (int e = 0; e < V; ++e) r[e] = v;
  return r;
}

// 16 bytes of 1.0 and of 0.0 in each storage type: what a missing weight or bias reads.
__device__ __align__(16) const uint32_t kOnesF32[4] = {0x3f800000u, 0x3f800000u, 0x3f800000u, 0x3f800000u};
__device__ __align__(16) const uint32_t kOnesBf16[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
__device__ __align__(16) const uint32_t kOnesF16[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
__device__ __align__(16) const uint32_t kZeros[4] = {0u, 0u, 0u, 0u};

template <class T>
__device__ __forceinline__ const T* ones() {
  if constexpr (std::is_same_v<T, float>) return reinterpret_cast<const T*>(kOnesF32);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return reinterpret_cast<const T*>(kOnesBf16);
  else return reinterpret_cast<const T*>(kOnesF16);
}
template <class T>
__device__ __forceinline__ const T* zeros() { return reinterpret_cast<const T*>(kZeros); }

// ---- forward --------------------------------------------------------------------------------
template <class T>
struct FwdParams {
  const T* x;
  T* out;
  const T* w;   // nullptr: no weight
  const T* b;   // nullptr: no bias
  float* mean;  // nullptr: not wanted (and always for RMSNorm)
  float* rstd;  // nullptr: not wanted
  int64_t stride[4];  // row strides (elements) of x, out, mean, rstd
  int64_t rows, n;
  float inv_n;        // 1 / n
  float eps;
  uint32_t zero;      // 0 (see refresh)
  int gs;  // threads per row group (a multiple of 32 dividing blockDim.x)
};

// kGs: the group size when fixed at compile time (0: p.gs), as in norm_backward_kernel.
// kPrefetch: the loop is persistent (the launcher sizes the grid to the resident CTAs) and each
// group loads its next row into a second fragment before it reduces, normalizes and stores the
// current one, so that the loads of short rows stay in flight through the reductions: two rows
// per group resident instead of one (see the top of the file).
template <class T, int V, int VPT, bool kRms, int kGs, bool kPrefetch>
__global__ __launch_bounds__(kPrefetch && VPT == 4 ? kPrefetchCta : kMaxThreads,
                             kPrefetch && VPT == 4 ? kPrefetchBlocks : 1)
void norm_forward_kernel(const FwdParams<T> p) {
  // RMSNorm reduces sum(x^2). LayerNorm: the prefetching tiers reduce the row's Moments (one
  // reduction, a shorter critical path per row) where the registers allow; the others sum x for
  // the mean and then the squared deviations from it (two reductions). ptxas spills with the
  // merge at 64 or 128 bytes of row per thread without prefetch and at 16-bit VPT 4 x 16 bytes
  // with it.
  constexpr bool kMoments = !kRms && kPrefetch && (sizeof(T) == 4 || VPT * V < 32);
  using Acc = std::conditional_t<kMoments, Moments, float>;
  using Op = std::conditional_t<kMoments, MergeMoments, tile::Sum>;
  __shared__ Acc slots[kBarrierGroups][2][32];
  // Weight and bias are loaded KB vectors at a time: all in flight together, but not so many
  // at once that they crowd the row out of the registers. 16-bit rows at 8 vectors per thread
  // take one at a time: with two, layer_norm spilled 12 bytes and bf16 4096 x 16384 took 80.7 us
  // instead of 75.0. (float32 rms_norm in groups of 32 spills 8 bytes with two, and is faster so
  // than with one: 13.5 against 14.1 us at 4096 x 1024.)
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
  auto load_row = [&](Frag<T, V>(&x)[VPT], const T* xr) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) x[k] = part.load(xr, k, 0.0f);
  };
  // Elements of this thread inside the row (vectors past its end read as 0 and are not counted).
  int mine = 0;
#pragma unroll
  for (int k = 0; k < VPT; ++k) mine += part.in(k) ? V : 0;

  const int64_t first = int64_t(blockIdx.x) * subs + sub;
  Frag<T, V> x[VPT];
  if (kPrefetch && first < p.rows) load_row(x, p.x + first * p.stride[0]);
  // Slot buffers alternate between consecutive reductions of a group: the barrier of the one in
  // between is passed only after every thread has read the buffer (see GroupSum). With one
  // reduction per row they alternate by row.
  int buf = 0;
  for (int64_t row = first; row < p.rows; row += int64_t(gridDim.x) * subs, buf ^= 1) {
    int64_t off[4];
    row_offsets(p.stride, row, off);
    Frag<T, V> next[VPT];
    if constexpr (kPrefetch) {
      const int64_t nrow = row + int64_t(gridDim.x) * subs;
      if (nrow < p.rows) load_row(next, p.x + nrow * p.stride[0]);
    } else {
      load_row(x, p.x + off[0]);
    }

    float mean = 0.0f, var;
    if constexpr (kRms) {
      float q = 0.0f;
#pragma unroll
      for (int k = 0; k < VPT; ++k)
#pragma unroll
        for (int e = 0; e < V; ++e) q = fmaf(x[k][e], x[k][e], q);
      var = sum(q, buf) * p.inv_n;
    } else if constexpr (!kMoments) {
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
    } else {
      // This thread's mean, then squared deviations from it over the registers again (skipping
      // vectors past the row end, which would add mean^2 each); then one merge over the group.
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
    const float rstd = rsqrtf(var + p.eps);
    refresh(x, rstd, p.zero);
    const int after = zero_after(rstd, p.zero);

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
        for (int e = 0; e < V; ++e) y[e] = fmaf((x[k0 + j][e] - mean) * rstd, w[j][e], b[j][e]);
        part.store(p.out + off[1], k0 + j, pack_each<T, V>(y));
      }
    }
    if (part.t == 0) {
      if (p.mean) p.mean[off[2]] = mean;
      if (p.rstd) p.rstd[off[3]] = rstd;
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) x[k] = next[k];
    }
  }
}

// load_packed with an L2 policy (tile::l2_policy) where the vector is 16 bytes.
template <class T, int V>
__device__ __forceinline__ Frag<T, V> load_packed_hint(const T* p, uint64_t policy) {
  if constexpr (sizeof(T) * V == 16) {
    const uint4 v = tile::load_16B_hint(p, policy);
    Frag<T, V> r;
    r.w[0] = v.x, r.w[1] = v.y, r.w[2] = v.z, r.w[3] = v.w;
    return r;
  } else {
    return tile::load_frag<T, V>(p);
  }
}

// Rows longer than the register-resident tiers hold (> 32768 elements; > 4096 where V = 1): one
// 1024-thread CTA per SM, persistent over rows, reading each row twice as
// torch.compile's norm kernels do. Pass 1 reduces it (RMSNorm: the sum of squares; LayerNorm:
// per-thread moments (count, mean, M2) built chunk by chunk and merged with Chan's formula, so
// mean and variance take one reduction and no E[x^2] - E[x]^2 cancellation), marking its lines
// L2 evict_last; pass 2 reads it again from L2 (evict_first), normalizes and writes. Nothing of
// the row is held across the reduction. One row per SM at a time keeps the rows being read
// twice within the L2 (132 x 256 KB for fp32 rows of 65536), and 4 vectors per thread (64 KB
// per SM) keep enough bytes in flight. Half-type rows stay packed (Packed) as in the tiers above.
// Against the kernel it replaced (one 512-thread CTA per row, 3-4 per SM, 2 vectors per thread
// in flight, each half-type element converted on its own), H200, tessera bench, us: layer_norm
// 1024 x 65536 fp32 198.6 -> 180.9, bf16 128.9 -> 91.0; 256 x 262144 fp32 210.1 -> 205.9, bf16
// 148.0 -> 102.2; rms_norm 1024 x 65536 fp32 197.6 -> 173.6, bf16 110.0 -> 81.2. (512-thread CTAs,
// two per SM: 256 x 262144 1-2% faster, 1024 x 65536 fp32 9-12% slower.)
constexpr int kLongThreads = 1024, kLongU1 = 4, kLongU2 = 2;  // vectors per thread in flight, passes 1 / 2

template <class T, int V, bool kRms>
__global__ __launch_bounds__(kLongThreads, 1) void norm_forward_stream_kernel(const FwdParams<T> p) {
  constexpr int kThreads = kLongThreads, U1 = kLongU1, U2 = kLongU2;
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
    A acc{};
    for (int64_t c0 = int64_t(threadIdx.x) * V; c0 < n; c0 += U1 * step) {
      Frag<T, V> x[U1];
#pragma unroll
      for (int u = 0; u < U1; ++u) {
        const int64_t c = c0 + u * step;
        x[u] = c < n ? tile::load_frag_hint<T, V>(xr + c, keep) : splat<T, V>(0.0f);
      }
      if constexpr (kRms) {
#pragma unroll
        for (int u = 0; u < U1; ++u)
#pragma unroll
          for (int e = 0; e < V; ++e) acc = fmaf(x[u][e], x[u][e], acc);
      } else {
        // This chunk's moments (n is a multiple of V here, or V is 1: a vector is wholly in the
        // row or wholly past it, and those past it read as 0), merged into the thread's.
        float cnt = 0.0f, sum = 0.0f;
#pragma unroll
        for (int u = 0; u < U1; ++u) {
          if (c0 + u * step < n) cnt += float(V);
#pragma unroll
          for (int e = 0; e < V; ++e) sum += x[u][e];
        }
        const float mean = sum * __fdividef(1.0f, cnt);
        float m2 = 0.0f;
#pragma unroll
        for (int u = 0; u < U1; ++u) {
          if (c0 + u * step >= n) continue;
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const float d = x[u][e] - mean;
            m2 = fmaf(d, d, m2);
          }
        }
        acc = MergeMoments{}(acc, Moments{cnt, mean, m2});
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
    for (int64_t c0 = int64_t(threadIdx.x) * V; c0 < n; c0 += U2 * step) {
      Frag<T, V> x[U2], w[U2], b[U2];
#pragma unroll
      for (int u = 0; u < U2; ++u) {
        const int64_t c = c0 + u * step;
        const bool in = c < n;
        x[u] = in ? tile::load_frag_hint<T, V>(xr + c, drop) : splat<T, V>(0.0f);
        w[u] = in && p.w ? tile::load_frag<T, V>(p.w + c) : splat<T, V>(1.0f);
        b[u] = in && p.b ? tile::load_frag<T, V>(p.b + c) : splat<T, V>(0.0f);
      }
#pragma unroll
      for (int u = 0; u < U2; ++u) {
        const int64_t c = c0 + u * step;
        if (c >= n) continue;
        float y[V];
#pragma unroll
        for (int e = 0; e < V; ++e) y[e] = fmaf((x[u][e] - mean) * rstd, w[u][e], b[u][e]);
        tile::store_frag<T, V>(p.out + off[1] + c, pack_each<T, V>(y));
      }
    }
    if (threadIdx.x == 0) {
      if (p.mean) p.mean[off[2]] = mean;
      if (p.rstd) p.rstd[off[3]] = rstd;
    }
  }
}

// ---- backward -------------------------------------------------------------------------------
template <class T>
struct BwdParams {
  const T* dy;
  const T* x;
  const T* w;          // nullptr: no weight (w = 1)
  const float* mean;   // nullptr for RMSNorm
  const float* rstd;
  T* dx;               // nullptr: grad_in not wanted
  float* part_w;       // [gridDim.x][ld] column sums of dy * xhat, or nullptr
  float* part_b;       // [gridDim.x][ld] column sums of dy, or nullptr
  float* row_means;    // long rows: [rows][2] mean(w dy), mean(w dy xhat) (see norm_backward_cols_kernel)
  int64_t stride[5];  // row strides (elements) of x, dy, dx, mean, rstd
  int64_t rows, n, ld;
  float inv_n;        // 1 / n
  uint32_t zero;      // 0 (see refresh)
  int gs;
  int stages;         // norm_backward_staged_kernel: ring slots per row group
};

// Running column sums of one row group in shared memory: a plane of VPT * V * gs floats, laid
// out [k][e / Q][thread][Q] with Q = 4 floats per access (1 for V = 1), so a thread's accesses
// are 16-byte vectors and a warp's are contiguous: no bank conflicts, two shared-memory
// instructions per four elements. (In registers they would cost 8-16 registers per plane per
// thread, which the row and its prefetched successor need.)
template <int VPT, int V>
struct ColumnSums {
  static constexpr int Q = V >= 4 ? 4 : 1;
  float* p;  // plane + thread * Q
  int gs;
  __device__ __forceinline__ ColumnSums(float* plane, int gs_, int t) : p(plane + t * Q), gs(gs_) {}
  __device__ __forceinline__ float* at(int k, int j) const { return p + (k * (V / Q) + j) * gs * Q; }
  __device__ __forceinline__ void zero() const {
#pragma unroll
    for (int k = 0; k < VPT; ++k)
#pragma unroll
      for (int j = 0; j < V / Q; ++j) tile::store<Q>(at(k, j), tile::Vec<float, Q>{});
  }
  // sums[k][j * Q, + Q) += v
  __device__ __forceinline__ void add(int k, int j, const float (&v)[Q]) const {
    tile::Vec<float, Q> s = tile::load<Q>(at(k, j));
#pragma unroll
    for (int i = 0; i < Q; ++i) s[i] += v[i];
    tile::store<Q>(at(k, j), s);
  }
};

// Adds the row groups' planes in group order and writes the CTA's partial row. Slot i of a
// plane holds Q columns: (k, j) = divmod(i / gs, V / Q), thread t = i % gs.
template <int VPT, int V>
__device__ __forceinline__ void write_partial(float* dst, const float* planes, int plane_stride, int subs,
                                              int gs, int n) {
  constexpr int Q = ColumnSums<VPT, V>::Q;
  const int slots = VPT * (V / Q) * gs;
  for (int i = threadIdx.x; i < slots; i += blockDim.x) {
    const int kj = i / gs, t = i - kj * gs;
    const int k = kj / (V / Q), j = kj - k * (V / Q);
    const int c = (k * gs + t) * V + j * Q;
    if (c >= n) continue;
    tile::Vec<float, Q> s = tile::load<Q>(planes + i * Q);
    for (int g = 1; g < subs; ++g) {
      const tile::Vec<float, Q> o = tile::load<Q>(planes + g * plane_stride + i * Q);
#pragma unroll
      for (int q = 0; q < Q; ++q) s[q] += o[q];
    }
    tile::store<Q>(dst + c, s);
  }
}

// kRing of norm_backward_kernel: each row group keeps a ring of kRing rows (x and dy) in
// registers and loads the next row into a slot as soon as the slot's row is finished, so kRing - 1
// rows' loads are in flight while one is reduced and written (kRing = 1: no prefetch). The first
// kRing rows are requested before the shared-memory setup, which their latency then covers.
//
// One or more row groups per CTA, each with its dw (and db) plane of ColumnSums in dynamic
// shared memory. kGs: the group size when fixed at compile time (0: p.gs). With it the per-vector
// column offsets are immediates instead of registers, which the widest rows need to fit in 64.
template <class T, int V, int VPT, bool kRms, int kRing, int kGs>
__global__ __launch_bounds__(kMaxThreads, 1) void norm_backward_kernel(const BwdParams<T> p) {
  extern __shared__ __align__(16) float dyn[];
  __shared__ Pair slots[kBarrierGroups][2][32];
  constexpr int E = VPT * V, kPlanes = kRms ? 1 : 2;
  const int gs = kGs ? kGs : p.gs, sub = threadIdx.x / gs, subs = blockDim.x / gs;
  const RowLanes<V> part{static_cast<int>(threadIdx.x) - sub * gs, gs, static_cast<int>(p.n)};
  GroupReduce<Pair> sum{slots[sub < kBarrierGroups ? sub : 0][0], gs, 1 + sub, part.t >> 5};
  const bool want_w = p.part_w != nullptr, want_b = !kRms && p.part_b != nullptr;

  struct Row {
    Frag<T, V> x[VPT], dy[VPT];
    float mean, rstd;
  };
  // x, dy and the statistics of a row.
  auto load = [&](Row& r, int64_t row) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      r.x[k] = part.load(p.x + row * p.stride[0], k, 0.0f);
      r.dy[k] = part.load(p.dy + row * p.stride[1], k, 0.0f);
    }
    r.mean = kRms ? 0.0f : p.mean[row * p.stride[3]];
    r.rstd = p.rstd[row * p.stride[4]];
  };

  const int64_t first = int64_t(blockIdx.x) * subs + sub, stride = int64_t(gridDim.x) * subs;
  Row ring[kRing];
#pragma unroll
  for (int i = 0; i < kRing; ++i)
    if (first + i * stride < p.rows) load(ring[i], first + i * stride);

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
  auto weight = [&](int k, int after) {
    return part.in(k) ? tile::load_frag<T, V>(sw + part.col(k) + after) : splat<T, V>(1.0f);
  };

  // dx of one row and its contributions to the column sums.
  auto process = [&](Row& cur, int64_t row) {
    // Vectors past the row end have x = dy = 0: they add nothing to the sums below.
    Pair s{0.0f, 0.0f};
    int after = 0;
    if (p.dx) {
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        const Frag<T, V> w = weight(k, zero_after(cur.rstd, p.zero));
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xh = (cur.x[k][e] - cur.mean) * cur.rstd;
          const float g = cur.dy[k][e] * w[e];
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
        const Frag<T, V> w = weight(k, after);
        float g[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xh = (cur.x[k][e] - cur.mean) * cur.rstd;
          g[e] = cur.rstd * (cur.dy[k][e] * w[e] - ma - xh * mb);
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
  };

  for (int64_t row0 = first; row0 < p.rows; row0 += kRing * stride) {
#pragma unroll
    for (int i = 0; i < kRing; ++i) {
      const int64_t row = row0 + i * stride;
      if (row >= p.rows) break;
      process(ring[i], row);
      if (row + kRing * stride < p.rows) load(ring[i], row + kRing * stride);
    }
  }

  if (!want_w && !want_b) return;  // uniform over the grid
  __syncthreads();
  const int64_t prow = int64_t(blockIdx.x) * p.ld;
  if (want_w) write_partial<VPT, V>(p.part_w + prow, dyn, kPlanes * plane, subs, gs, part.n);
  if (want_b) write_partial<VPT, V>(p.part_b + prow, dyn + plane, kPlanes * plane, subs, gs, part.n);
}

// Backward with the rows staged in shared memory (sm_90; rows of up to 64 KB of x and dy): each
// row group keeps a ring of p.stages rows (x and dy) in shared memory, filled by bulk copies that
// its first thread issues, so the next rows' loads stay in flight while the group computes,
// however few registers that leaves. The registers then go where the register-resident kernel
// above cannot afford them, at 16 elements per thread (twice as many rows' worth of overhead
// saved per reduction as one vector per thread):
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
// groups as in norm_backward_kernel (a function of the shape and the GPU), and the groups' sums
// are added in group order at the end: dw/db are deterministic.
template <class T, int V, int VPT, bool kRms, int kGs, int kSubs>
__global__ __launch_bounds__(kGs * kSubs, 1) void norm_backward_staged_kernel(const BwdParams<T> p) {
  extern __shared__ __align__(16) unsigned char staged[];
  __shared__ uint64_t full[kSubs][kMaxStages];
  __shared__ Pair slots[kSubs][2][32];
  constexpr int E = VPT * V;
  const int sub = threadIdx.x / kGs, stages = p.stages;
  const RowLanes<V> part{static_cast<int>(threadIdx.x) - sub * kGs, kGs, static_cast<int>(p.n)};
  const GroupReduce<Pair> sum{slots[sub][0], kGs, 1 + sub, part.t >> 5};
  const bool want_w = p.part_w != nullptr, want_b = !kRms && p.part_b != nullptr;
  const bool leader = part.t == 0;
  const uint32_t row_bytes = static_cast<uint32_t>(p.n * sizeof(T));
  T* const ring = reinterpret_cast<T*>(staged) + int64_t(sub) * stages * 2 * p.n;  // [stage][x, dy][n]
  auto bar = [&](int s) { return tile::BulkBarrier{&full[sub][s]}; };
  const int64_t first = int64_t(blockIdx.x) * kSubs + sub, stride = int64_t(gridDim.x) * kSubs;
  auto fill = [&](int s, int64_t row) {  // by the leader
    bar(s).expect(2 * row_bytes);
    bar(s).copy(ring + int64_t(s) * 2 * p.n, p.x + row * p.stride[0], row_bytes);
    bar(s).copy(ring + int64_t(s) * 2 * p.n + p.n, p.dy + row * p.stride[1], row_bytes);
  };

  if (leader) {
    for (int s = 0; s < stages; ++s) bar(s).init();
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  // Two slots first, the rest once the first row has landed: all slots at once (up to 25 MB over
  // the GPU) let every first row land only near the end of that transfer (6-8 us into the
  // kernel at bf16 4096, measured with %globaltimer), with nothing to compute meanwhile.
  // (At 32 elements per thread, with three slots and no registers to spare, all at once.)
  constexpr int kFirstFills = E <= 16 ? 2 : kMaxStages;
  if (leader)
    for (int s = 0; s < kFirstFills && s < stages; ++s)
      if (first + s * stride < p.rows) fill(s, first + s * stride);

  // The weight in registers: as floats at 16 elements per thread, packed and converted where
  // used at 32.
  constexpr bool kFloatW = E <= 16;
  Frag<T, V> wp[VPT];
  float wf[E], sw[E], sb[E];
#pragma unroll
  for (int k = 0; k < VPT; ++k) {
    wp[k] = part.in(k) && p.w ? tile::load_frag<T, V>(p.w + part.col(k)) : splat<T, V>(1.0f);
#pragma unroll
    for (int e = 0; e < V; ++e) wf[k * V + e] = wp[k][e], sw[k * V + e] = 0.0f, sb[k * V + e] = 0.0f;
  }
  auto w = [&](int k, int e) { return kFloatW ? wf[k * V + e] : wp[k][e]; };
  auto stats = [&](int64_t row, float& mean, float& rstd) {
    mean = kRms || row >= p.rows ? 0.0f : p.mean[row * p.stride[3]];
    rstd = row >= p.rows ? 0.0f : p.rstd[row * p.stride[4]];
  };
  float mean, rstd;
  stats(first, mean, rstd);

  // What the dx pass needs of the row: xhat and w dy, kept as floats from the first pass at 16
  // elements per thread; at 32 (where they would not fit) x and dy read from the slot again, which
  // then is refilled one row later.
  constexpr bool kKeep = E <= 16;
  float xh[kKeep ? E : 1], g[kKeep ? E : 1];

  int i = 0, s = 0;
  uint32_t parity = 0;
  for (int64_t row = first; row < p.rows; row += stride, ++i) {
    float mean_next, rstd_next;  // one row ahead: their latency hides behind this row
    stats(row + stride, mean_next, rstd_next);
    bar(s).wait(parity);
    if constexpr (kFirstFills < kMaxStages) {
      if (i == 0 && leader)
        for (int t = kFirstFills; t < stages; ++t)
          if (first + t * stride < p.rows) fill(t, first + t * stride);
    }
    const T* xs = ring + int64_t(s) * 2 * p.n;
    const T* dys = xs + p.n;
    const float shift = -mean * rstd;  // xhat = x * rstd + shift

    // One pass over the staged row: the two row sums dx needs, and the row's dw/db terms.
    Pair acc{0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const bool in = part.in(k);
      const Frag<T, V> xv = in ? tile::load_frag<T, V>(xs + part.col(k)) : splat<T, V>(0.0f);
      const Frag<T, V> dv = in ? tile::load_frag<T, V>(dys + part.col(k)) : splat<T, V>(0.0f);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float d = dv[e], xhat = fmaf(xv[e], rstd, shift), gw = d * w(k, e);
        if constexpr (kKeep) xh[k * V + e] = xhat, g[k * V + e] = gw;
        if constexpr (!kRms) acc.a += gw;
        acc.b = fmaf(gw, xhat, acc.b);
        sw[k * V + e] = fmaf(d, xhat, sw[k * V + e]);
        if constexpr (!kRms) sb[k * V + e] += d;
      }
    }
    if (p.dx) {
      acc = sum(acc, i & 1);
    } else {  // no reduction: the group still meets, for the refill below
      __syncwarp();
      if (kGs > 32) asm volatile("bar.sync %0, %1;" ::"r"(1 + sub), "r"(kGs) : "memory");
    }
    if constexpr (kKeep) {
      asm volatile("" ::: "memory");  // the staged row is read above this line, never below
      // Every thread of the group is done with slot s: it takes row i + stages.
      if (leader && row + stages * stride < p.rows) fill(s, row + stages * stride);
    } else if (leader && i > 0 && row + (stages - 1) * stride < p.rows) {
      // Every thread of the group is done with the previous row's slot.
      fill(s == 0 ? stages - 1 : s - 1, row + (stages - 1) * stride);
    }

    if (p.dx) {
      // dx = rstd (w dy - ma - xhat mb)
      const float mb = acc.b * p.inv_n, c = kRms ? 0.0f : -acc.a * p.inv_n * rstd;
#pragma unroll
      for (int k = 0; k < VPT; ++k) {
        if (!part.in(k)) continue;
        Frag<T, V> xv, dv;
        if constexpr (!kKeep) xv = tile::load_frag<T, V>(xs + part.col(k)), dv = tile::load_frag<T, V>(dys + part.col(k));
        float out[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float xhat = kKeep ? xh[k * V + e] : fmaf(xv[e], rstd, shift);
          const float gw = kKeep ? g[k * V + e] : dv[e] * w(k, e);
          out[e] = fmaf(fmaf(-xhat, mb, gw), rstd, c);
        }
        tile::store_frag<T, V>(p.dx + row * p.stride[2] + part.col(k), pack_each<T, V>(out));
      }
    }
    mean = mean_next, rstd = rstd_next;
    if (++s == stages) s = 0, parity ^= 1u;
  }

  if (!want_w && !want_b) return;  // uniform over the grid
  // Every copy issued was waited for, so the ring is free: it takes the groups' sums as planes
  // in write_partial's layout (ColumnSums), one plane per group, added there in group order.
  constexpr int Q = ColumnSums<VPT, V>::Q;
  float* planes = reinterpret_cast<float*>(staged);
  const int plane = E * kGs;
  const ColumnSums<VPT, V> mine(planes + sub * plane, kGs, part.t);
  const int64_t prow = int64_t(blockIdx.x) * p.ld;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    if (which == 0 ? !want_w : !want_b) continue;  // uniform
    const float* src = which == 0 ? sw : sb;
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

// Rows too long for registers take two kernels. norm_backward_rowsums_kernel reads x and dy
// once (one CTA per row) for the two row means dx needs, ma = mean(w dy) and mb = mean(w dy
// xhat); norm_backward_cols_kernel then gives each CTA a slice of columns and a range of rows:
// each thread owns one vector of columns, reads x and dy there row after row, writes dx and
// keeps its dw/db sums in registers, and writes them as one partial row at the end. x and dy
// are read twice (5 row-sized transfers instead of 3), but nothing else is: the one-kernel form
// this replaced read-modify-wrote its column sums in global memory for every row (layer_norm
// fp32 1024 x 65536 at 775 GB/s, bf16 at 273).
template <class T, int V, bool kRms>
__global__ __launch_bounds__(kStreamThreads, 2) void norm_backward_rowsums_kernel(const BwdParams<T> p) {
  // Vectors of x, dy and w per thread in flight, within 64 registers (two CTAs per SM); 16-bit
  // ones take twice the registers as floats. Against U = 4 at up to 123 registers (one CTA per
  // SM): layer_norm backward bf16 1024 x 65536 295.5 -> 252.7 us, fp32 343.1 -> 338.7 (ptxas
  // spills 12-48 bytes).
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
        x[u] = tile::load_tile<V>(xr, c0 + u * step, n, zero);
        dy[u] = tile::load_tile<V>(dyr, c0 + u * step, n, zero);
        w[u] = p.w ? tile::load_tile<V>(p.w, c0 + u * step, n, one) : fill_vec<T, V>(one);
      }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float g = tile::to_float(dy[u][e]) * tile::to_float(w[u][e]);
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

template <class T, int V, bool kRms>
__global__ __launch_bounds__(kColThreads) void norm_backward_cols_kernel(const BwdParams<T> p, int64_t rows_per_cta) {
  constexpr int R = kColRows<T>;
  const T zero = tile::from_float<T>(0.0f), one = tile::from_float<T>(1.0f);
  const int64_t c = (int64_t(blockIdx.x) * kColThreads + threadIdx.x) * V, n = p.n;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_cta, r1 = std::min(p.rows, r0 + rows_per_cta);
  if (c >= n) return;  // no barrier below
  const tile::Vec<T, V> w = p.w ? tile::load_tile<V>(p.w, c, n, one) : fill_vec<T, V>(one);
  float sw[V] = {}, sb[V] = {};
  for (int64_t r = r0; r < r1; r += R) {
    tile::Vec<T, V> x[R], dy[R];
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (r + u < r1) {
        int64_t off[5];
        row_offsets(p.stride, r + u, off);
        x[u] = tile::load_tile<V>(p.x + off[0], c, n, zero);
        dy[u] = tile::load_tile<V>(p.dy + off[1], c, n, zero);
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
        g[e] = tile::from_float<T>(rstd * (d * tile::to_float(w[e]) - ma - xh * mb));
        sw[e] = fmaf(d, xh, sw[e]);
        sb[e] += d;
      }
      if (p.dx) tile::store_tile<V>(p.dx + off[2], c, n, g);
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

// dw/db = the G partial rows summed per column: a block of kSumThreads threads is split
// kSumThreads / kSplit columns x kSplit (the power of two >= G, at most kSumSplit) row slices;
// thread (x, y) adds rows y, y + kSplit, ... of its column, then the kSplit results are added in y
// order. Fixed order for a given G. Each thread loads at most ~4 values (G ~ the SM count for the
// tier kernels), all issued before the first is used: one round of L2 latency. Launched as a
// programmatic dependent of the backward kernel (launch_dependent). Measured under ncu with 16
// slices of 32 columns it took 4.1-5.1 us after the 54-110 us main kernels; with 32 slices and the
// dependent launch the ops gained 1-5 us (docs/worklog.md, session 5).
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

// ---- host: configuration and launch -----------------------------------------------------------
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int round_up32(int64_t v) { return static_cast<int>(ceil_div(v, 32) * 32); }
unsigned grid_of(int64_t blocks) {
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, int64_t(INT32_MAX)));
}

// Raises the kernel's dynamic shared-memory limit when it needs more than the default 48 KB.

// Row groups of gs threads; CTAs of at least kFwdCta threads (several groups when gs is small).
// Without prefetch one row per group; with it the grid is persistent: no more CTAs than are
// resident at once, each group looping over rows with the next one's loads in flight. Of those,
// only as many as give every group the same number of rows (+- 1): with 4096 rows and 3168
// resident groups, 2048 groups of 2 rows rather than 928 of 2 and 2240 of 1: the kernel takes
// two rows' time either way, and the fewer groups compete less for bandwidth.
template <class T, int V, int VPT, bool kRms, int kGs = 0, bool kPrefetch = false>
void launch_forward(FwdParams<T> p, int gs, int device, cudaStream_t stream, int cta = kFwdCta) {
  p.gs = gs;
  const int subs = gs < cta && cta % gs == 0 ? cta / gs : 1;
  const auto kernel = norm_forward_kernel<T, V, VPT, kRms, kGs, kPrefetch>;
  int64_t grid = ceil_div(p.rows, subs);
  if constexpr (kPrefetch) {
    const int nb = runtime::resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), gs * subs);
    const int64_t resident = int64_t(runtime::device_props(device).multiProcessorCount) * nb * subs;
    const int64_t per_group = ceil_div(p.rows, resident);
    grid = ceil_div(ceil_div(p.rows, per_group), subs);
  }
  kernel<<<grid_of(grid), gs * subs, 0, stream>>>(p);
}

// Vectors per thread: the smallest of 1, 2, 4 that lets one warp hold the row, else 4 with as
// many warps as needed (up to 1024 threads), else the streaming kernel. 64 bytes of row per
// thread: with the row's addresses and the weight/bias in flight that is what fits in 64
// registers without spills. Rows of up to 4 x 256 vectors (16 KB) prefetch the group's next
// row into a second fragment (persistent grid; at VPT 4 in up to 80 registers, so groups of at
// most 256 threads): one row per group leaves too few bytes in flight per SM for such short
// rows. On sm_90, float32 rows over 512 x 4 vectors take 8 vectors (128
// bytes) per thread in a fixed 512- or 1024-thread group (fixed, so that the column offsets of
// the 8 vectors are immediates; sm_80 spills even so): 512 threads keep two CTAs per SM where
// 1024 x 4 would allow one.
// Mid-length rows on sm_90 (float32 256..2048 vectors, 16-bit 512..2048 for LayerNorm and
// 1024..2048 for RMSNorm) do better still with 8 vectors per thread in small groups, one row per
// group, the group size a compile-time power of two (32..256), CTAs of at least kFwdCta8
// threads: more CTAs per SM, fewer threads per row to reduce over. Measured (tessera bench, H200)
// against the tiers above: layer_norm fp32 N = 1024 / 4096 / 8192: 14.3 / 42.0 / 75.0 -> 13.1 /
// 39.4 / 71.5 us, bf16 16384 82.1 -> 80.7; rms_norm bf16 16384 75.6 -> 72.3 (session 4, L2 flushed
// by memset); with 256-thread CTAs (session 5, read flush) layer_norm bf16 4096 / 8192 23.7 /
// 40.8 -> 22.2 / 37.4 us, rms_norm bf16 8192 35.7 -> 35.2, but rms_norm bf16 4096 20.5 -> 20.8:
// it stays on the prefetching tier.
template <class T, int V, bool kRms>
void forward_v(const FwdParams<T>& p, int device, cudaStream_t stream) {
  const int64_t nv = ceil_div(p.n, V);
  const bool sm90 = V > 1 && runtime::device_props(device).major >= 9;
  const bool wide = V == 4 && sm90;  // float32, 16-byte vectors
  if (nv <= 32) return launch_forward<T, V, 1, kRms, 0, true>(p, 32, device, stream);
  if (nv <= 64) return launch_forward<T, V, 2, kRms, 0, true>(p, 32, device, stream);
  if constexpr (V > 1) {
    if (sm90 && nv <= 2048 && nv >= (V == 4 ? 256 : kRms ? 1024 : 512)) {
      int gs = 32;
      while (gs * 8 < nv) gs *= 2;
      if constexpr (V == 4) {  // 16-bit rows here have >= 512 vectors: gs >= 64
        if (gs == 32) return launch_forward<T, V, 8, kRms, 32>(p, 32, device, stream, kFwdCta8);
      }
      if (gs == 64) return launch_forward<T, V, 8, kRms, 64>(p, 64, device, stream, kFwdCta8);
      if (gs == 128) return launch_forward<T, V, 8, kRms, 128>(p, 128, device, stream, kFwdCta8);
      return launch_forward<T, V, 8, kRms, 256>(p, 256, device, stream, kFwdCta8);
    }
  }
  if (nv <= 4 * kPrefetchCta)
    return launch_forward<T, V, 4, kRms, 0, true>(p, round_up32(ceil_div(nv, 4)), device, stream);
  if (nv <= (wide ? 2 : 4) * kMaxThreads)
    return launch_forward<T, V, 4, kRms>(p, round_up32(ceil_div(nv, 4)), device, stream);
  if constexpr (V == 4) {
    if (wide && nv <= 4 * kMaxThreads) return launch_forward<T, V, 8, kRms, 512>(p, 512, device, stream);
    if (wide && nv <= 8 * kMaxThreads) return launch_forward<T, V, 8, kRms, 1024>(p, 1024, device, stream);
  }
  const int64_t sms = runtime::device_props(device).multiProcessorCount;
  norm_forward_stream_kernel<T, V, kRms><<<grid_of(std::min(p.rows, sms)), kLongThreads, 0, stream>>>(p);
}

// sum_partials_kernel with the fewest row slices that cover the G partial rows (up to kSumSplit).
template <class T, int kSplit>
void launch_sum_partials(const BwdParams<T>& p, int64_t groups, T* dw, T* db, int device, cudaStream_t stream) {
  if constexpr (kSplit < kSumSplit) {
    if (kSplit < groups) return launch_sum_partials<T, 2 * kSplit>(p, groups, dw, db, device, stream);
  }
  constexpr int kCols = kSumThreads / kSplit;
  runtime::launch_dependent(sum_partials_kernel<T, kSplit>, dim3(grid_of(ceil_div(p.n, kCols)), 2),
                            dim3(kCols, kSplit), 0, stream, device, p.part_w, p.part_b,
                            static_cast<int>(groups), p.n, p.ld, dw, db);
}

template <class T>
struct BwdPlan {
  void (*kernel)(BwdParams<T>) = nullptr;
  int gs = 0, threads = 0, stages = 0;
  std::size_t smem = 0;
  int64_t grid = 0;
  int64_t groups = 0;  // partial rows of column sums
  // Long rows (kernel null): norm_backward_rowsums_kernel, then norm_backward_cols_kernel on a
  // grid of (cols, groups) CTAs with rows_per_cta rows each.
  void (*rowsums)(BwdParams<T>) = nullptr;
  void (*cols_kernel)(BwdParams<T>, int64_t) = nullptr;
  int64_t cols = 0, rows_per_cta = 0;
};

// Row groups of gs threads, as many per CTA as fit in 1024 threads (15 at most when they need
// a named barrier); one CTA per SM, so the grid is the number of SMs (or of row groups needed).
// Dynamic shared memory: the column-sum planes, then the weight. Empty (kernel null) when that
// exceeds what the GPU allows a CTA.
template <class T, int V, int VPT, bool kRms, int kRing, int kGs = 0>
BwdPlan<T> backward_tier(int64_t n, int64_t rows, int device) {
  BwdPlan<T> pl;
  const auto kernel = norm_backward_kernel<T, V, VPT, kRms, kRing, kGs>;
  pl.gs = kGs ? kGs : round_up32(ceil_div(ceil_div(n, V), VPT));
  const int subs = std::max(1, std::min(kMaxThreads / pl.gs, pl.gs == 32 ? 32 : kBarrierGroups));
  pl.threads = pl.gs * subs;
  pl.smem = std::size_t(kRms ? 1 : 2) * VPT * V * pl.threads * sizeof(float) +
            std::size_t(ceil_div(n * sizeof(T), 16) * 16);
  const cudaDeviceProp& props = runtime::device_props(device);
  if (pl.smem + runtime::static_smem_bytes(reinterpret_cast<const void*>(kernel)) > props.sharedMemPerBlockOptin)
    return {};
  pl.kernel = kernel;
  const int nb = runtime::resident_blocks_per_sm(reinterpret_cast<const void*>(pl.kernel), pl.threads, pl.smem);
  pl.grid = std::min<int64_t>(int64_t(props.multiProcessorCount) * nb, ceil_div(rows, subs));
  return pl;
}

// The staged kernel with groups of kGs threads holding VPT vectors each: kSubs = 512 / kGs groups
// per CTA, one CTA per SM, as many ring slots per group as ~200 KB allow. Empty when fewer than
// 3 fit (one row in flight would not beat the register-resident tiers).
template <class T, int V, bool kRms, int kGs, int VPT = 16 / V>
BwdPlan<T> staged_tier(int64_t n, int64_t rows, int device) {
  constexpr int kSubs = 512 / kGs;
  const auto kernel = norm_backward_staged_kernel<T, V, VPT, kRms, kGs, kSubs>;
  const cudaDeviceProp& props = runtime::device_props(device);
  const std::size_t budget = std::min<std::size_t>(
      props.sharedMemPerBlockOptin - runtime::static_smem_bytes(reinterpret_cast<const void*>(kernel)), 200 * 1024);
  const std::size_t slot = 2 * std::size_t(n) * sizeof(T);
  const int stages = static_cast<int>(std::min<std::size_t>(kMaxStages, budget / (kSubs * slot)));
  if (stages < 3) return {};
  BwdPlan<T> pl;
  pl.kernel = kernel;
  pl.gs = kGs;
  pl.threads = kGs * kSubs;
  pl.stages = stages;
  pl.smem = std::max(kSubs * stages * slot, std::size_t(kSubs) * VPT * V * kGs * sizeof(float));
  // The fewest CTAs (<= one per SM) that give no group more rows than one per SM would: every
  // group then has the same number of rows, +-1, and the DRAM stays busy to the end (4096 rows:
  // 128 CTAs of 16 rows per group instead of 132 with 15 or 16; measured 1-3% faster at N = 1024
  // .. 8192, e.g. layer_norm fp32 4096 55.1-55.8 -> 54.1 us, rms_norm bf16 4096 33.6 -> 33.0).
  const int64_t per_group = ceil_div(rows, int64_t(props.multiProcessorCount) * kSubs);
  pl.grid = ceil_div(rows, kSubs * per_group);
  return pl;
}

template <class T, int V, bool kRms>
BwdPlan<T> plan_staged(int64_t n, int64_t rows, int device) {
  if constexpr (V == 1) {
    return {};
  } else {
    if (runtime::device_props(device).major < 9) return {};
    const int64_t nv = ceil_div(n, V);
    // 16-bit rows over 4096 elements: 32 per thread (at 8192, two groups per CTA instead of one:
    // layer_norm bf16 63.8 -> 61.3 us, rms_norm 60.8 -> 57.4; at <= 4096 no better or slower).
    // Not fp16 LayerNorm: its conversions leave it spilling there (8192: 75.0 us against bf16's
    // 61.3); it keeps 16 per thread to 8192 and the register tiers beyond.
    if constexpr (std::is_same_v<T, __nv_bfloat16> || (sizeof(T) == 2 && kRms)) {
      if (nv > 512 && nv <= 256 * 32 / V) return staged_tier<T, V, kRms, 256, 32 / V>(n, rows, device);
      if (nv > 512 && nv <= 512 * 32 / V) return staged_tier<T, V, kRms, 512, 32 / V>(n, rows, device);
    }
    const int64_t per_thread = ceil_div(nv, 16 / V);  // threads of 16 elements
    if (per_thread <= 32) return staged_tier<T, V, kRms, 32>(n, rows, device);
    if (per_thread <= 64) return staged_tier<T, V, kRms, 64>(n, rows, device);
    if (per_thread <= 128) return staged_tier<T, V, kRms, 128>(n, rows, device);
    if (per_thread <= 256) return staged_tier<T, V, kRms, 256>(n, rows, device);
    if (per_thread <= 512) return staged_tier<T, V, kRms, 512>(n, rows, device);
    return {};
  }
}

// Tiers by vectors per row (see the top of the file): column sums take VPT * V <= 16 floats per
// thread and plane in shared memory (<= 128 KB); the row itself, and the next one where
// there is room, sit in registers.
template <class T, int V, bool kRms>
BwdPlan<T> plan_backward(int64_t n, int64_t rows, int device) {
  const int64_t nv = ceil_div(n, V);
  BwdPlan<T> pl = plan_staged<T, V, kRms>(n, rows, device);
  if (pl.kernel) {
    pl.groups = pl.grid;
    return pl;
  }
  if constexpr (V > 1) {
    // Rows of 256..1024 vectors take two vectors per thread: half the threads per row, so twice
    // the row groups per SM (measured: one vector per thread with a ring of three rows in groups
    // of up to 1024 threads was 10-20% slower). Up to 2048 vectors, a ring of two rows of two
    // vectors per thread: 4-6% faster than loading the next row's dy vector by vector as the
    // current row's were finished, though ptxas spills 4-24 bytes in four of its kernels (bf16
    // LayerNorm the most).
    if (nv <= kMaxThreads / 4) {
      pl = backward_tier<T, V, 1, kRms, 2>(n, rows, device);
    } else if (nv <= kMaxThreads) {
      pl = backward_tier<T, V, 2, kRms, 1>(n, rows, device);
    } else if (nv <= 2 * kMaxThreads) {
      pl = backward_tier<T, V, 2, kRms, 2, kMaxThreads>(n, rows, device);
    } else if constexpr (V <= 4) {
      if (nv <= 4 * kMaxThreads) pl = backward_tier<T, V, 4, kRms, 1, kMaxThreads>(n, rows, device);
    }
  } else {
    if (nv <= kMaxThreads) pl = backward_tier<T, 1, 1, kRms, 2>(n, rows, device);
    else if (nv <= 4 * kMaxThreads) pl = backward_tier<T, 1, 4, kRms, 2>(n, rows, device);
    else if (nv <= 8 * kMaxThreads) pl = backward_tier<T, 1, 8, kRms, 1, kMaxThreads>(n, rows, device);
  }
  if (pl.kernel) {
    pl.groups = pl.grid;
    return pl;
  }
  // Longer rows: the two-kernel form, one wave of column-slice CTAs with as many row ranges as
  // fill it (each range a partial row of column sums).
  pl.rowsums = norm_backward_rowsums_kernel<T, V, kRms>;
  pl.cols_kernel = norm_backward_cols_kernel<T, V, kRms>;
  pl.cols = ceil_div(nv, kColThreads);
  const int nb = runtime::resident_blocks_per_sm(reinterpret_cast<const void*>(pl.cols_kernel), kColThreads);
  const int64_t slots = int64_t(runtime::device_props(device).multiProcessorCount) * nb;
  const int64_t ranges = std::clamp<int64_t>(slots / pl.cols, 1, std::min<int64_t>(rows, 65535));
  pl.rows_per_cta = ceil_div(rows, ranges);
  pl.groups = ceil_div(rows, pl.rows_per_cta);
  return pl;
}

template <class F>
void with_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::float32: f(float{}); break;
    case DType::float16: f(__half{}); break;
    default: f(__nv_bfloat16{}); break;
  }
}

// ---- host: shapes, layouts and checks -------------------------------------------------------
int64_t product(const int64_t* s, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; ++d) p *= s[d];
  return p;
}

// True when dimensions [lead, ndim) form one dense block (stride 1 innermost, row-major).
bool block_dense(const TensorView& t, int lead) {
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= lead; --d) {
    if (t.shape[d] == 1) continue;
    if (t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// The distance between consecutive rows when the first `lead` dimensions of t collapse into one
// (row r then starts at r * stride), or nothing when they do not.
std::optional<int64_t> row_stride(const TensorView& t, int lead) {
  std::optional<int64_t> stride;
  int64_t extent = 1;
  for (int d = lead - 1; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (!stride) stride = t.strides[d];
    else if (t.strides[d] != *stride * extent) return std::nullopt;
    extent *= t.shape[d];
  }
  return stride.value_or(0);
}

// Every row of t starts on a 16-byte boundary. (The vector path also needs N % V == 0: Cols.)
template <class T>
bool rows_aligned(const TensorView& t, int64_t stride) {
  constexpr int V = tile::kVec16<T>;
  return tile::is_aligned<T, V>(t.data) && stride % V == 0;
}

// What the kernels index: a uniform row stride and, for x-like tensors (`block`), a dense
// normalized block. Layouts that are neither get a contiguous copy in scratch memory: inputs
// are copied in here, outputs are written there and copied out by copy_back().
bool kernel_ready(const TensorView& t, int lead, bool block) {
  return (!block || block_dense(t, lead)) && row_stride(t, lead).has_value();
}

TensorView contiguous_scratch(const TensorView& t, runtime::Scratch& keep, cudaStream_t stream) {
  keep = runtime::Scratch(t.nbytes(), stream);
  return TensorView::make(keep.data(), t.dtype, t.shape, nullptr, t.ndim, t.device);
}

TensorView as_input(const TensorView& t, int lead, bool block, runtime::Scratch& keep, cudaStream_t stream) {
  if (kernel_ready(t, lead, block)) return t;
  const TensorView c = contiguous_scratch(t, keep, stream);
  copy(t, c, stream);
  return c;
}

TensorView as_output(const TensorView& t, int lead, bool block, runtime::Scratch& keep, cudaStream_t stream) {
  return kernel_ready(t, lead, block) ? t : contiguous_scratch(t, keep, stream);
}

void copy_back(const TensorView& used, const TensorView* out, cudaStream_t stream) {
  if (out && used.data != out->data) copy(used, *out, stream);
}

void zero_fill(const TensorView& t, cudaStream_t stream) {
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream));
    return;
  }
  runtime::Scratch z;
  const TensorView c = contiguous_scratch(t, z, stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(c.data, 0, c.nbytes(), stream));
  copy(c, t, stream);
}

void check_shape(const char* op, const char* arg, const TensorView& t, const int64_t* shape, int ndim,
                 const char* what) {
  bool same = t.ndim == ndim;
  for (int d = 0; same && d < ndim; ++d) same = t.shape[d] == shape[d];
  if (!same)
    detail::throw_arg(ErrorKind::value, op, arg,
                      "shape " + detail::shape_str(shape, ndim) + " (" + what + ")", t.shape_str());
}

void check_x(const char* op, const TensorView& x, int nnorm) {
  detail::check_cuda_tensor(op, "x", x);
  detail::check_dtype_in(op, "x", x, {DType::float32, DType::float16, DType::bfloat16});
  if (nnorm < 1 || nnorm > x.ndim)
    detail::throw_arg(ErrorKind::value, op, "normalized_ndim",
                      "1 <= normalized_ndim <= x.ndim = " + std::to_string(x.ndim), std::to_string(nnorm));
}

// A tensor like x (grad_out, out, grad_in).
// weight, bias, grad_weight, grad_bias: x's dtype, the normalized shape.
void check_param(const char* op, const char* arg, const TensorView& t, const TensorView& x, int lead) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_device(op, arg, t, "x", x);
  detail::check_same_dtype(op, arg, t, "x", x);
  check_shape(op, arg, t, x.shape + lead, x.ndim - lead, "the normalized shape of 'x'");
}

// mean, rstd: float32, the leading shape.
void check_stats(const char* op, const char* arg, const TensorView& t, const TensorView& x, int lead) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_device(op, arg, t, "x", x);
  detail::check_dtype_in(op, arg, t, {DType::float32});
  check_shape(op, arg, t, x.shape, lead, "the leading shape of 'x'");
}

void check_eps(const char* op, double eps) {
  if (!(std::isfinite(eps) && eps >= 0.0 && eps <= FLT_MAX)) {
    std::ostringstream got;
    got << eps;
    detail::throw_arg(ErrorKind::value, op, "eps", "a finite value >= 0 (representable as float32)", got.str());
  }
}

struct Named {
  const char* name;
  const TensorView* t;
};

// Each output: no element written twice, no overlap with any input or with an earlier output.
void check_outputs(const char* op, std::initializer_list<Named> outs, std::initializer_list<Named> ins) {
  std::vector<Named> seen;
  for (const Named& o : outs) {
    if (!o.t) continue;
    detail::check_no_internal_overlap(op, o.name, *o.t);
    for (const Named& i : ins)
      if (i.t) detail::check_no_overlap(op, o.name, *o.t, i.name, *i.t, false);
    for (const Named& s : seen) detail::check_no_overlap(op, o.name, *o.t, s.name, *s.t, false);
    seen.push_back(o);
  }
}

// ---- host: the two drivers --------------------------------------------------------------------
void norm_forward(const char* op, bool rms, const TensorView& x, int nnorm, const TensorView* weight,
                  const TensorView* bias, double eps, const TensorView& out, const TensorView* mean,
                  const TensorView* rstd, cudaStream_t stream) {
  check_x(op, x, nnorm);
  const int lead = x.ndim - nnorm;
  if (weight) check_param(op, "weight", *weight, x, lead);
  if (bias) check_param(op, "bias", *bias, x, lead);
  check_eps(op, eps);
  detail::check_like(op, "out", out, "x", x);
  if (mean) check_stats(op, "mean", *mean, x, lead);
  if (rstd) check_stats(op, "rstd", *rstd, x, lead);
  check_outputs(op, {{"out", &out}, {"mean", mean}, {"rstd", rstd}},
                {{"x", &x}, {"weight", weight}, {"bias", bias}});
  if (x.numel() == 0) return;

  runtime::DeviceGuard guard(x.device.index);
  runtime::Scratch xs, os, ws, bs, ms, rs;
  const TensorView xv = as_input(x, lead, true, xs, stream);
  const TensorView ov = as_output(out, lead, true, os, stream);
  const TensorView wv = weight ? as_input(*weight, 0, true, ws, stream) : TensorView{};
  const TensorView bv = bias ? as_input(*bias, 0, true, bs, stream) : TensorView{};
  const TensorView mv = mean ? as_output(*mean, lead, false, ms, stream) : TensorView{};
  const TensorView rv = rstd ? as_output(*rstd, lead, false, rs, stream) : TensorView{};

  with_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = tile::kVec16<T>;
    FwdParams<T> p{};
    p.x = static_cast<const T*>(xv.data);
    p.out = static_cast<T*>(ov.data);
    p.w = weight ? static_cast<const T*>(wv.data) : nullptr;
    p.b = bias ? static_cast<const T*>(bv.data) : nullptr;
    p.mean = mean ? static_cast<float*>(mv.data) : nullptr;
    p.rstd = rstd ? static_cast<float*>(rv.data) : nullptr;
    p.stride[0] = *row_stride(xv, lead);
    p.stride[1] = *row_stride(ov, lead);
    p.stride[2] = mean ? *row_stride(mv, lead) : 0;
    p.stride[3] = rstd ? *row_stride(rv, lead) : 0;
    p.rows = product(x.shape, 0, lead);
    p.n = product(x.shape, lead, x.ndim);
    p.inv_n = static_cast<float>(1.0 / static_cast<double>(p.n));
    p.eps = static_cast<float>(eps);
    const bool vec = p.n % V == 0 && rows_aligned<T>(xv, p.stride[0]) && rows_aligned<T>(ov, p.stride[1]) &&
                     (!p.w || tile::is_aligned<T, V>(p.w)) && (!p.b || tile::is_aligned<T, V>(p.b));
    const int device = x.device.index;
    if (rms) {
      if (vec) forward_v<T, V, true>(p, device, stream);
      else forward_v<T, 1, true>(p, device, stream);
    } else {
      if (vec) forward_v<T, V, false>(p, device, stream);
      else forward_v<T, 1, false>(p, device, stream);
    }
    TESSERA_LAUNCH_CHECK();
  });
  copy_back(ov, &out, stream);
  if (mean) copy_back(mv, mean, stream);
  if (rstd) copy_back(rv, rstd, stream);
}

void norm_backward(const char* op, bool rms, const TensorView& grad_out, const TensorView& x, int nnorm,
                   const TensorView* mean, const TensorView& rstd, const TensorView* weight,
                   const TensorView* grad_in, const TensorView* grad_weight, const TensorView* grad_bias,
                   cudaStream_t stream) {
  check_x(op, x, nnorm);
  const int lead = x.ndim - nnorm;
  detail::check_like(op, "grad_out", grad_out, "x", x);
  if (mean) check_stats(op, "mean", *mean, x, lead);
  check_stats(op, "rstd", rstd, x, lead);
  if (weight) check_param(op, "weight", *weight, x, lead);
  if (grad_in) detail::check_like(op, "grad_in", *grad_in, "x", x);
  if (grad_weight) {
    if (!weight)
      detail::throw_arg(ErrorKind::value, op, "grad_weight", "nullptr when 'weight' is not given",
                        "a tensor");
    check_param(op, "grad_weight", *grad_weight, x, lead);
  }
  if (grad_bias) check_param(op, "grad_bias", *grad_bias, x, lead);
  check_outputs(op, {{"grad_in", grad_in}, {"grad_weight", grad_weight}, {"grad_bias", grad_bias}},
                {{"grad_out", &grad_out}, {"x", &x}, {"mean", mean}, {"rstd", &rstd}, {"weight", weight}});

  const int64_t rows = product(x.shape, 0, lead), n = product(x.shape, lead, x.ndim);
  const bool sums = grad_weight || grad_bias;
  if (n == 0 || (!grad_in && !sums) || (rows == 0 && !sums)) return;
  runtime::DeviceGuard guard(x.device.index);
  if (rows == 0) {  // column sums over no rows: zeros, as torch gives
    if (grad_weight) zero_fill(*grad_weight, stream);
    if (grad_bias) zero_fill(*grad_bias, stream);
    return;
  }

  runtime::Scratch xs, dys, dxs, ws, dws, dbs, ms, rs, parts, means;
  const TensorView xv = as_input(x, lead, true, xs, stream);
  const TensorView dyv = as_input(grad_out, lead, true, dys, stream);
  const TensorView mv = mean ? as_input(*mean, lead, false, ms, stream) : TensorView{};
  const TensorView rv = as_input(rstd, lead, false, rs, stream);
  const TensorView wv = weight ? as_input(*weight, 0, true, ws, stream) : TensorView{};
  const TensorView dxv = grad_in ? as_output(*grad_in, lead, true, dxs, stream) : TensorView{};
  const TensorView dwv = grad_weight ? as_output(*grad_weight, 0, true, dws, stream) : TensorView{};
  const TensorView dbv = grad_bias ? as_output(*grad_bias, 0, true, dbs, stream) : TensorView{};
  const int device = x.device.index;

  with_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = tile::kVec16<T>;
    BwdParams<T> p{};
    p.dy = static_cast<const T*>(dyv.data);
    p.x = static_cast<const T*>(xv.data);
    p.w = weight ? static_cast<const T*>(wv.data) : nullptr;
    p.mean = mean ? static_cast<const float*>(mv.data) : nullptr;
    p.rstd = static_cast<const float*>(rv.data);
    p.dx = grad_in ? static_cast<T*>(dxv.data) : nullptr;
    p.stride[0] = *row_stride(xv, lead);
    p.stride[1] = *row_stride(dyv, lead);
    p.stride[2] = grad_in ? *row_stride(dxv, lead) : 0;
    p.stride[3] = mean ? *row_stride(mv, lead) : 0;
    p.stride[4] = *row_stride(rv, lead);
    p.rows = rows;
    p.n = n;
    p.ld = ceil_div(n, 4) * 4;  // 16-byte aligned partial rows
    p.inv_n = static_cast<float>(1.0 / static_cast<double>(n));
    const bool vec = n % V == 0 && rows_aligned<T>(xv, p.stride[0]) && rows_aligned<T>(dyv, p.stride[1]) &&
                     (!grad_in || rows_aligned<T>(dxv, p.stride[2])) && (!p.w || tile::is_aligned<T, V>(p.w));
    BwdPlan<T> pl;
    if (rms) pl = vec ? plan_backward<T, V, true>(n, rows, device) : plan_backward<T, 1, true>(n, rows, device);
    else pl = vec ? plan_backward<T, V, false>(n, rows, device) : plan_backward<T, 1, false>(n, rows, device);
    p.gs = pl.gs;
    p.stages = pl.stages;
    if (sums) {
      parts = runtime::Scratch(std::size_t(pl.groups) * p.ld * sizeof(float) * 2, stream);
      p.part_w = grad_weight ? parts.as<float>() : nullptr;
      p.part_b = grad_bias ? parts.as<float>() + pl.groups * p.ld : nullptr;
    }
    if (pl.kernel) {
      runtime::allow_dynamic_smem(reinterpret_cast<const void*>(pl.kernel), pl.smem);
      pl.kernel<<<grid_of(pl.grid), pl.threads, pl.smem, stream>>>(p);
      TESSERA_LAUNCH_CHECK();
    } else {
      if (grad_in) {
        means = runtime::Scratch(std::size_t(rows) * 2 * sizeof(float), stream);
        p.row_means = means.as<float>();
        pl.rowsums<<<grid_of(rows), kStreamThreads, 0, stream>>>(p);
        TESSERA_LAUNCH_CHECK();
      }
      pl.cols_kernel<<<dim3(grid_of(pl.cols), static_cast<unsigned>(pl.groups)), kColThreads, 0, stream>>>(
          p, pl.rows_per_cta);
      TESSERA_LAUNCH_CHECK();
    }
    if (sums) {
      launch_sum_partials<T, 1>(p, pl.groups, grad_weight ? static_cast<T*>(dwv.data) : nullptr,
                                grad_bias ? static_cast<T*>(dbv.data) : nullptr, device, stream);
      TESSERA_LAUNCH_CHECK();
    }
  });
  if (grad_in) copy_back(dxv, grad_in, stream);
  if (grad_weight) copy_back(dwv, grad_weight, stream);
  if (grad_bias) copy_back(dbv, grad_bias, stream);
}

}  // namespace

void layer_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, const TensorView* bias,
                double eps, const TensorView& out, const TensorView* mean, const TensorView* rstd,
                cudaStream_t stream) {
  runtime::NvtxRange range("tessera::layer_norm");
  norm_forward("layer_norm", false, x, normalized_ndim, weight, bias, eps, out, mean, rstd, stream);
}

void layer_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                         const TensorView& mean, const TensorView& rstd, const TensorView* weight,
                         const TensorView* grad_in, const TensorView* grad_weight,
                         const TensorView* grad_bias, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::layer_norm_backward");
  norm_backward("layer_norm_backward", false, grad_out, x, normalized_ndim, &mean, rstd, weight, grad_in,
                grad_weight, grad_bias, stream);
}

void rms_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, double eps,
              const TensorView& out, const TensorView* rstd, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rms_norm");
  norm_forward("rms_norm", true, x, normalized_ndim, weight, nullptr, eps, out, nullptr, rstd, stream);
}

void rms_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                       const TensorView& rstd, const TensorView* weight, const TensorView* grad_in,
                       const TensorView* grad_weight, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rms_norm_backward");
  norm_backward("rms_norm_backward", true, grad_out, x, normalized_ndim, nullptr, rstd, weight, grad_in,
                grad_weight, nullptr, stream);
}

}  // namespace tessera
