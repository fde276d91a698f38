// The GEMM tier that takes anything: any dtype, any strides, any GPU, K = 0. Exact float32
// arithmetic (FFMA), so it is also tessera's float32 matmul where TF32 is not allowed.
//
// Two kernels:
//   float32   float32 operands (sm_80 on), each K-major (K contiguous) or MN-major (its rows
//             contiguous and 16-byte aligned): 128 x 128 output tiles, 256 threads of 8 x 8
//             outputs each, asynchronous copies (tile/async_copy.cuh) into a ring of
//             shared-memory slices. The float32 workhorse, in the design of the classic SGEMM
//             kernels. Where the tiles leave SMs idle (a small M x N over a long K), K is split
//             over several CTAs a tile, which meet on a counter.
//   generic   everything else (other strides and alignments, 16-bit and float8 inputs): 64 x 64
//             tiles, 4 x 4 outputs per thread, loads element by element through the strides
//             (gemm_simt_generic.cu, compiled apart). The layouts that matter for 16-bit inputs
//             are the tensor-core tiers'; this kernel is what correctness rests on everywhere else.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "tile/async_copy.cuh"
#include "tile/convert.cuh"
#include "tile/sync.cuh"

namespace tessera::matrix {
namespace {

constexpr int kThreads = 256;

// ---- float32 ---------------------------------------------------------------------------------
//
// Each operand is seen as [MN, K] (A as it is, B transposed) and staged K-outer in shared memory,
// s[k][mn], so that a thread's 4 consecutive rows (or columns) are one 16-byte shared load. The
// copies are asynchronous (sm_80 on), kStages slices in flight, so that no registers hold the next
// slice: an MN-major operand in 16-byte copies, a K-major one transposed on the way in by 4-byte
// copies. Zero fill (the copies' source size) covers the tails in M, N and K.

constexpr int kBig = 128, kSlice = 16, kPad = 4, kStages = 4;
constexpr int kSmem = 2 * kStages * kSlice * (kBig + kPad) * int(sizeof(float));
// A split CTA takes kMinChunk of K at least (the ring of slices filled once); a tile's last CTA
// reads every chunk's 64 KB of partial sums, so a tile takes kMaxSplits chunks at most.
constexpr int kMinChunk = kStages * kSlice, kMaxSplits = 4;

// K split over `splits` CTAs a tile, each summing `chunk` of K (a multiple of kSlice) into its
// partial sums; the tile's last CTA to count itself in adds every chunk's, in chunk order (the
// same bits every run), and runs the epilogue.
struct SplitK {
  int splits = 1, chunk = 0;
  float* partial = nullptr;      // [tiles][splits][64 values][kThreads]: stores coalesced
  unsigned* counters = nullptr;  // one a tile, lent zero and left zero
};

struct Operand {
  const float* p;
  int64_t s_b, s_mn, s_k, extent;  // strides (elements) and the length along MN
};


// One thread's share of each 128 x kSlice slice of an operand, per 8 of K (h): K-major, 4 rows 32
// apart, one K each, a warp covering 4 whole 32-byte rows and the 32 shared-memory banks (a warp's
// copies must read whole rows: four K of one row a thread would touch 16 rows a copy);
// MN-major, 4 consecutive MN of one K, a warp reading 512 contiguous bytes.
template <bool KMajor>
struct Stage {
  const float* p;  // the share's first element in the next slice
  int in;          // K-major: bit i, whether row i is in range; MN-major: elements in range, <= 4

  static __device__ __forceinline__ int kk() { return KMajor ? threadIdx.x % 8 : threadIdx.x / 32; }
  static __device__ __forceinline__ int mn() {
    return KMajor ? threadIdx.x / 8 : threadIdx.x % 32 * 4;
  }

  __device__ Stage(const Operand& o, int64_t b, int64_t mn0, int64_t k0) {
    const int64_t left = o.extent - mn0 - mn();
    p = o.p + b * o.s_b + (mn0 + mn()) * o.s_mn + (k0 + kk()) * o.s_k;
    in = KMajor ? (left > 0) | (left > 32) << 1 | (left > 64) << 2 | (left > 96) << 3
                : int(left < 0 ? 0 : left < 4 ? left : 4);
  }

  // Starts the copy of the next slice, which has `rem` of K from its start on, into s: K is tested
  // only in the slice that it ends inside.
  __device__ __forceinline__ void issue(float (*s)[kBig + kPad], int rem, const Operand& o) {
    if (rem >= kSlice) copy<false>(s, rem, o);
    else copy<true>(s, rem, o);
    p += KMajor ? kSlice : kSlice * o.s_k;
  }

  template <bool Tail>
  __device__ __forceinline__ void copy(float (*s)[kBig + kPad], int rem, const Operand& o) const {
#pragma unroll
    for (int h = 0; h < kSlice; h += 8) {
      const bool k_in = !Tail || kk() + h < rem;
      if (KMajor) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
          tile::cp_async<4>(tile::smem_addr(&s[kk() + h][mn() + 32 * i]),
                            p + h + 32 * i * o.s_mn, k_in && (in >> i & 1) ? 4 : 0);
      } else {
        tile::cp_async<16>(tile::smem_addr(&s[kk() + h][mn()]), p + h * o.s_k, k_in ? 4 * in : 0);
      }
    }
  }
};

// Two float4s of shared memory `apart` floats apart, as 8 floats.
__device__ __forceinline__ void frag(float (&v)[8], const float* p, int apart) {
  *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(p);
  *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(p + apart);
}

// A split tile's CTA leaves its partial sums; the last of the tile's CTAs gets true back, with acc
// the sum of every chunk's in chunk order (its own read back too), the others false.
__device__ bool sum_chunks(float (&acc)[8][8], const SplitK& s, int64_t t, int chunk) {
  float* mine = s.partial + (t * s.splits + chunk) * 64 * kThreads + threadIdx.x;
#pragma unroll
  for (int v = 0; v < 64; ++v) mine[v * kThreads] = acc[v / 8][v % 8];
  if (!tile::last_to_arrive(&s.counters[t], unsigned(s.splits))) return false;
#pragma unroll
  for (int v = 0; v < 64; ++v) acc[v / 8][v % 8] = 0.f;
  for (int c = 0; c < s.splits; ++c) {
    const float* from = s.partial + (t * s.splits + c) * 64 * kThreads + threadIdx.x;
#pragma unroll
    for (int v = 0; v < 64; ++v) acc[v / 8][v % 8] += __ldcg(from + v * kThreads);
  }
  return true;
}

// Warps in a 4 x 2 grid of 32 x 64 each; a warp's lanes 4 x 8, each owning a 2 x 2 grid of
// 4 x 4 blocks 16 rows and 32 columns apart. A k step reads one float4 per block row and column:
// lanes of a quarter-warp read 8 consecutive float4s of B (all banks) and one of A (broadcast).
template <bool KA, bool KB>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_f32_kernel(const Operand a_op, const Operand b_op, const Epilogue<float> epi,
                    const TileOrder order, int k, const SplitK split) {
  extern __shared__ float4 smem[];  // as[kStages], then bs[kStages]
  auto* as = reinterpret_cast<float(*)[kSlice][kBig + kPad]>(smem);
  auto* bs = as + kStages;
  __shared__ int64_t tile[3];  // batch, first row, first column: kept out of the loop's registers
  const auto e = epi.resolved();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tm = warp / 2 * 32 + lane / 8 * 4, tn = warp % 2 * 64 + lane % 8 * 4;
  float acc[8][8] = {};
  // This CTA's tile, and its chunk of K (all of K without a split).
  const int64_t t = blockIdx.x / split.splits;
  const int chunk = int(blockIdx.x % split.splits), k0 = chunk * split.chunk;
  {
    int64_t b;
    int tile_m, tile_n;
    order.at(t, b, tile_m, tile_n);
    if (threadIdx.x == 0)
      tile[0] = b, tile[1] = int64_t(tile_m) * kBig, tile[2] = int64_t(tile_n) * kBig;
    Stage<KA> sa(a_op, b, int64_t(tile_m) * kBig, k0);
    Stage<KB> sb(b_op, b, int64_t(tile_n) * kBig, k0);
    k = split.splits > 1 ? min(k - k0, split.chunk) : k;  // from here on, this chunk's length
    const int slices = (k + kSlice - 1) / kSlice;
    // Groups are committed even when empty, so that the wait below counts slices.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < slices) sa.issue(as[s], k - s * kSlice, a_op), sb.issue(bs[s], k - s * kSlice, b_op);
      tile::cp_async_commit();
    }
    for (int s = 0; s < slices; ++s) {
      tile::cp_async_wait<kStages - 2>();  // this thread's copies of slice s have landed
      __syncthreads();             // everyone's; and slice s - 1's buffer is read by all
      const int next = s + kStages - 1, cur = s % kStages;
      if (next < slices) {
        sa.issue(as[next % kStages], k - next * kSlice, a_op);
        sb.issue(bs[next % kStages], k - next * kSlice, b_op);
      }
      tile::cp_async_commit();
#pragma unroll
      for (int kk = 0; kk < kSlice; ++kk) {
        float av[8], bv[8];
        frag(av, &as[cur][kk][tm], 16);
        frag(bv, &bs[cur][kk][tn], 32);
#pragma unroll
        for (int i = 0; i < 8; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
    }
    tile::cp_async_wait<0>();
    __syncthreads();  // tile[] written
  }
  if (split.splits > 1 && !sum_chunks(acc, split, t, chunk)) return;
  const int64_t b = tile[0], m0 = tile[1] + tm, n0 = tile[2] + tn;
  e.with_activation<false>([&](auto act) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // column pairs: n0, n0 + 2, n0 + 32, n0 + 34
      const int64_t col = n0 + j / 2 * 32 + j % 2 * 2;
      if (col >= b_op.extent) continue;
      const auto cols = e.cols(col, col + 1 < b_op.extent);
#pragma unroll
      for (int i = 0; i < 8; ++i) {  // rows m0 + 0..3, m0 + 16..19
        const int64_t row = m0 + i / 4 * 16 + i % 4;
        if (row < a_op.extent)
          e.store_pair(e.row(b, row), cols, acc[i][2 * j], acc[i][2 * j + 1], act);
      }
    }
  });
}

// An operand the float32 kernel takes: K-major (K contiguous; rows at any alignment, copied 4
// bytes at a time) or MN-major (MN contiguous, every row start 16-byte aligned). A dimension of
// extent 1 may have any stride.
bool copyable(const void* p, int64_t s_b, int64_t s_mn, int64_t s_k, int64_t mn, int64_t k,
              bool& k_major) {
  k_major = s_k == 1 || k == 1;
  return k_major || ((s_mn == 1 || mn == 1) && s_k % 4 == 0 && s_b % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(p) % 16 == 0);
}

template <bool KA, bool KB>
void launch_f32(const GemmArgs& g, const SimtTier::Plan& p, cudaStream_t stream) {
  const Operand a{static_cast<const float*>(g.a), g.a_sb, g.a_sm, g.a_sk, g.m};
  const Operand b{static_cast<const float*>(g.b), g.b_sb, g.b_sn, g.b_sk, g.n};
  if constexpr (kSmem > 48 * 1024)
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(gemm_f32_kernel<KA, KB>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const int64_t tiles = p.order.count();
  const runtime::SplitScratch parts(p.splits, std::size_t(tiles * p.splits) * 64 * kThreads, std::size_t(tiles),
                                    stream);
  const SplitK split{p.splits, p.chunk, parts.partials(), parts.counters<unsigned>()};
  gemm_f32_kernel<KA, KB><<<p.grid, kThreads, kSmem, stream>>>(a, b, Epilogue<float>::from(g),
                                                               p.order, int(g.k), split);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

std::string SimtTier::Plan::describe() const {
  if (!fast)
    return "generic " + std::to_string(kSimtTile) + " x " + std::to_string(kSimtTile) +
           " tiles through strides, grid " + std::to_string(grid.x) + " x " +
           std::to_string(grid.y) + " x " + std::to_string(grid.z);
  return "float32 " + std::to_string(kBig) + " x " + std::to_string(kBig) +
         " tiles, 8 x 8 per thread, A " + (a_kmajor ? "K" : "M") + "-major, B " +
         (b_kmajor ? "K" : "N") + "-major, group " + std::to_string(order.group) +
         (splits > 1 ? ", K split " + std::to_string(splits) + " ways of " + std::to_string(chunk) : "") +
         ", grid " + std::to_string(grid.x);
}

SimtTier::Plan SimtTier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  Plan p;
  p.fast = ctx.major >= 8 && g.dtype == DType::float32 && g.out_dtype == DType::float32 &&
           g.k < (1 << 30) && copyable(g.a, g.a_sb, g.a_sm, g.a_sk, g.m, g.k, p.a_kmajor) &&
           copyable(g.b, g.b_sb, g.b_sn, g.b_sk, g.n, g.k, p.b_kmajor);
  if (p.fast) {
    p.order.tiles_m = int((g.m + kBig - 1) / kBig);
    p.order.tiles_n = int((g.n + kBig - 1) / kBig);
    p.order.batch = g.batch;
    p.order.group = g.config.group > 0 ? g.config.group : 8;
    // K split where the tiles fill less than a wave of resident CTAs (two an SM): as many chunks
    // as still fit in one, up to kMaxSplits, each kMinChunk of K at least.
    const int64_t tiles = p.order.count(), wave = 2 * int64_t(ctx.sms);
    const int64_t splits = std::min<int64_t>({wave / std::max<int64_t>(tiles, 1), g.k / kMinChunk, kMaxSplits});
    p.chunk = int(g.k);
    if (splits > 1) {
      p.chunk = int(runtime::ceil_div(runtime::ceil_div(g.k, splits), int64_t(kSlice)) * kSlice);
      p.splits = int(runtime::ceil_div(g.k, int64_t(p.chunk)));
    }
    p.grid = dim3(unsigned(tiles * p.splits));  // one tile (or chunk) per CTA: under 2^31 in any memory
    return p;
  }
  p.grid = dim3(unsigned((g.n + kSimtTile - 1) / kSimtTile),
                unsigned(std::min<int64_t>((g.m + kSimtTile - 1) / kSimtTile, 65535)),
                unsigned(std::min<int64_t>(g.batch, 65535)));
  return p;
}

void SimtTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  if (!p.fast) return launch_simt_generic(g, p.grid, stream);
  using Launch = void (*)(const GemmArgs&, const Plan&, cudaStream_t);
  const Launch f32[2][2] = {{launch_f32<false, false>, launch_f32<false, true>},
                            {launch_f32<true, false>, launch_f32<true, true>}};
  f32[p.a_kmajor][p.b_kmajor](g, p, stream);
}

}  // namespace tessera::matrix
