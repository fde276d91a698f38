// The portable tensor-core GEMM tier (sm_80 on): asynchronous copies (tile/async_copy.cuh) fill a
// ring of shared-memory stages, warps multiply with mma.sync on fragments that ldmatrix loads from
// them.
//
// One CTA per output tile (kBM x BN), in grouped raster order (TileOrder), batches after each
// other. Each warp owns a block of the tile: float32 accumulators in registers, m16n8k16 mma
// tiles. The K loop runs over kBK-deep blocks: while the warps multiply block kb, the copies of
// blocks kb + 1 .. kb + kStages - 1 are in flight, so that the tensor cores wait on shared
// memory, not on DRAM. One barrier per block: after it, block kb has landed for every thread's
// copies and every warp is done with block kb - 1, whose stage the next copies refill.
//
// Operands: each of A and B K-major (K contiguous) or MN-major (M resp. N contiguous), a template
// flag each. Either is copied as it lies (16-byte chunks along the contiguous dimension) and the
// MN-major one read with ldmatrix.trans, which hands out the same fragment registers, so no
// layout is transposed first. Tails: a chunk reads only its elements inside the matrix and the
// copy zero-fills the rest (its source size), so the mma adds zeros past M, N and K; the
// epilogue stores only rows and columns inside C.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "tile/async_copy.cuh"
#include "tile/mma.cuh"

namespace tessera::matrix {
namespace {

constexpr int kBM = 128, kBK = 32;
constexpr int kChunk = 8;  // 16-bit elements per 16-byte copy
constexpr int kEpiCols = 32, kEpiStride = kEpiCols + 8;  // the epilogue's passes (store_tile)

// A kBM x BN CTA tile on 2 x WarpsN warps, each a (kBM / 2) x (BN / WarpsN) block of it, a ring
// of Stages kBK-deep stages.
template <int BN_, int WarpsN, int Stages, int MinBlocks>
struct Shape {
  static constexpr int BN = BN_, kWarpsM = 2, kWarpsN = WarpsN, kStages = Stages;
  static constexpr int kMinBlocks = MinBlocks;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kWM = kBM / kWarpsM, kWN = BN / kWarpsN;  // a warp's block
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;             // its m16 x n8 mma tiles
  static constexpr int kABytes = kBM * kBK * 2, kStageBytes = (kBM + BN) * kBK * 2;
  static constexpr std::size_t kSmem = std::size_t(kStages) * kStageBytes;
  static_assert(kWN % kEpiCols == 0 && 4 * kWarpsM * kWarpsN * kWM * kEpiStride <= kSmem,
                "the epilogue's slices (store_tile) fit in the ring");
};
// Square: 64 x 64 warp blocks, the fewest shared-memory reads per mma that the registers allow;
// two CTAs per SM rather than one CTA of twice the warps, since CTAs do not wait at each other's
// barriers: one CTA's mma run while the other's warps wait on theirs.
// Narrow: where the tiles are fewer than the SMs, twice the warps on each, for the latency that
// one CTA per SM leaves exposed; its ring as deep as the epilogue's slices make its shared
// memory anyway.
using Square = Shape<128, 2, 4, 2>;  // 4 warps of 64 x 64
using Narrow = Shape<128, 4, 5, 2>;  // 8 warps of 64 x 32

// ---- shared-memory tiles ------------------------------------------------------------------------
// A stage holds A's kBM x kBK tile, then B's BN x kBK tile, each in its operand's own order, with
// the 16-byte chunks of each row permuted so that the 8 rows one ldmatrix matrix reads (at one
// chunk column) fall on 8 distinct 16-byte bank groups, and the copies of 8 consecutive threads
// fill whole 128-byte lines.
//   K-major   row r (of M or N) is kBK K-values, 64 bytes: chunk c at c ^ ((r / 2) % 4)
//   MN-major  row k is Rows M- or N-values: chunk c at c ^ (k % 8)

__device__ __forceinline__ int kmajor_offset(int r, int c) {
  return r * kBK + ((c ^ ((r >> 1) & 3)) << 3);
}

template <int Rows>
__device__ __forceinline__ int mnmajor_offset(int k, int c) {
  return k * Rows + ((c ^ (k & 7)) << 3);
}

// An operand as the copies see it: `rows` rows (M or N) by `k`, its contiguous dimension K
// (K-major) or the rows (MN-major), `stride` the step of the other one, `sb` of the batch.
template <class T>
struct Operand {
  const T* p;
  int64_t rows, k, stride, sb;
  __device__ __forceinline__ const T* at(int64_t batch) const { return p + batch * sb; }
};

// Rows x kBK of an operand (rows from row0, K from k0) into the tile at shared `dst`.
template <class T, bool KMajor, int Rows, int Threads>
__device__ __forceinline__ void load_tile(uint32_t dst, const T* p, const Operand<T>& op,
                                          int64_t row0, int64_t k0, int tid) {
  constexpr int kPerRow = KMajor ? kBK / kChunk : Rows / kChunk;  // chunks per tile row
  constexpr int kChunks = Rows * kBK / kChunk;
  static_assert(kChunks % Threads == 0 && Threads % kPerRow == 0, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kChunks / Threads; ++i) {
    const int id = tid + i * Threads, r = id / kPerRow, c = id % kPerRow;
    const int64_t row = KMajor ? row0 + r : row0 + c * kChunk;
    const int64_t k = KMajor ? k0 + c * kChunk : k0 + r;
    // Elements of the chunk inside the matrix along its contiguous dimension (0: it is outside).
    const int64_t left = KMajor ? (row < op.rows ? op.k - k : 0) : (k < op.k ? op.rows - row : 0);
    const int bytes = left <= 0 ? 0 : left >= kChunk ? 16 : int(left) * 2;
    const T* src = bytes == 0 ? p : KMajor ? p + row * op.stride + k : p + k * op.stride + row;
    const int off = KMajor ? kmajor_offset(r, c) : mnmajor_offset<Rows>(r, c);
    tile::cp_async<16>(dst + 2 * off, src, bytes);
  }
}

// A warp's ldmatrix addresses in one operand's tile: Loads x4 loads per 16-deep step, each a
// 16 x 16 block (rows x K) at rows mn0 + 16 f. Matrix j of a load is the 8 x 8 block at rows
// +dm, K +dk, in the order the mma registers take them: A (m lo, k lo), (m hi, k lo),
// (m lo, k hi), (m hi, k hi); B two n8 tiles, (n lo, k lo), (n lo, k hi), (n hi, k lo),
// (n hi, k hi). Offsets are computed once: moving to the next 16 rows (K-major) or the next 16 K
// (MN-major) leaves the chunk permutation as it is, a constant step.
template <bool KMajor, int Rows, bool IsA, int Loads>
struct FragLoader {
  uint32_t off[KMajor ? kBK / 16 : Loads];  // bytes into the tile: per step (K-major), per load

  __device__ __forceinline__ FragLoader(int mn0, int lane) {
    const int j = lane / 8, i = lane % 8;
    const int dm = 8 * (IsA ? j & 1 : j >> 1), dk = 8 * (IsA ? j >> 1 : j & 1);
#pragma unroll
    for (int x = 0; x < (KMajor ? kBK / 16 : Loads); ++x)
      off[x] = 2 * (KMajor ? kmajor_offset(mn0 + dm + i, (16 * x + dk) / 8)
                           : mnmajor_offset<Rows>(dk + i, (mn0 + 16 * x + dm) / 8));
  }

  // Load f of step kk from the tile at shared `tile`.
  __device__ __forceinline__ void load(uint32_t (&r)[4], uint32_t tile, int f, int kk) const {
    const uint32_t o = KMajor ? off[kk] + f * 16 * kBK * 2 : off[f] + kk * 16 * Rows * 2;
    tile::ldmatrix_x4<!KMajor>(r, tile + o);
  }
};

template <class S, bool KA, bool KB>
struct WarpLoaders {
  FragLoader<KA, kBM, true, S::kMT> a;
  FragLoader<KB, S::BN, false, S::kNT / 2> b;
};

// The warp's mma over one stage: kBK / 16 steps of its kMT x kNT tiles.
template <class T, class S, bool KA, bool KB>
__device__ __forceinline__ void mma_stage(float (&acc)[S::kMT][S::kNT][4],
                                          const WarpLoaders<S, KA, KB>& ld, uint32_t stage) {
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    uint32_t a[S::kMT][4], b[S::kNT][2];
#pragma unroll
    for (int mt = 0; mt < S::kMT; ++mt) ld.a.load(a[mt], stage, mt, kk);
#pragma unroll
    for (int np = 0; np < S::kNT / 2; ++np) {
      uint32_t r[4];
      ld.b.load(r, stage + S::kABytes, np, kk);
      b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
    }
#pragma unroll
    for (int mt = 0; mt < S::kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < S::kNT; ++nt) tile::mma_m16n8k16<T>(acc[mt][nt], a[mt], b[nt]);
  }
}

// The K loop of one tile (rows row0 of A, columns col0 of B) over the ring at shared `ring`.
template <class T, class S, bool KA, bool KB>
__device__ __forceinline__ void mainloop(float (&acc)[S::kMT][S::kNT][4], uint32_t ring,
                                         const Operand<T>& a, const Operand<T>& b, int64_t batch,
                                         int64_t row0, int64_t col0,
                                         const WarpLoaders<S, KA, KB>& ld) {
  const T* pa = a.at(batch);
  const T* pb = b.at(batch);
  const int tid = threadIdx.x, k_blocks = int((a.k + kBK - 1) / kBK);
  constexpr int kStages = S::kStages;
  auto fill = [&](int kb, int stage) {
    const uint32_t at = ring + stage * S::kStageBytes;
    load_tile<T, KA, kBM, S::kThreads>(at, pa, a, row0, int64_t(kb) * kBK, tid);
    load_tile<T, KB, S::BN, S::kThreads>(at + S::kABytes, pb, b, col0, int64_t(kb) * kBK, tid);
  };
#pragma unroll 1  // unrolled, its copies' address arithmetic costs registers the main loop needs
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_blocks) fill(s, s);
    tile::cp_async_commit();  // empty groups too: the wait below counts groups
  }
  int read = 0, write = kStages - 1;  // the stages of blocks kb and kb + kStages - 1
  for (int kb = 0; kb < k_blocks; ++kb) {
    tile::cp_async_wait<kStages - 2>();  // block kb's group has landed (this thread's copies)
    __syncthreads();               // ... every thread's; and block kb - 1's stage is free
    if (kb + kStages - 1 < k_blocks) fill(kb + kStages - 1, write);
    tile::cp_async_commit();
    mma_stage<T, S>(acc, ld, ring + read * S::kStageBytes);
    read = read == kStages - 1 ? 0 : read + 1;
    write = write == kStages - 1 ? 0 : write + 1;
  }
}

// The warp's accumulators through the epilogue, kEpiCols columns a pass through its own slice
// `buf` of shared memory: written in the fragment layout (acc[mt][nt] holds rows 16 mt + lane / 4
// and + 8, columns 8 nt + 2 (lane % 4) and the next), read back four columns a lane, a row per 8
// lanes (store_staged), so that a store instruction writes whole row segments. Rows padded to
// kEpiStride floats put the fragment writes of a half-warp on distinct banks. The passes are a
// loop, not unrolled, each picking its columns of acc by selects (the indices into acc stay
// constants, so acc stays in registers): the epilogue's code, every activation's, appears once.
template <class S, class OutT>
__device__ __forceinline__ void store_tile(const Epilogue<OutT>& epi,
                                           const float (&acc)[S::kMT][S::kNT][4], float* buf,
                                           int64_t batch, int64_t row0, int64_t col0, int64_t m,
                                           int64_t n, int lane) {
  constexpr int kPasses = S::kWN / kEpiCols, kTilesPerPass = kEpiCols / 8;
  const int rows = m - row0 < S::kWM ? int(m - row0) : S::kWM;
  const int cols = n - col0 < S::kWN ? int(n - col0) : S::kWN;
  if (rows <= 0 || cols <= 0) return;
#pragma unroll 1
  for (int pass = 0; pass < kPasses && pass * kEpiCols < cols; ++pass) {
#pragma unroll
    for (int mt = 0; mt < S::kMT; ++mt)
#pragma unroll
      for (int i = 0; i < kTilesPerPass; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float2 v = make_float2(acc[mt][i][2 * h], acc[mt][i][2 * h + 1]);
#pragma unroll
          for (int p = 1; p < kPasses; ++p) {
            const float* w = acc[mt][p * kTilesPerPass + i] + 2 * h;
            if (pass == p) v = make_float2(w[0], w[1]);
          }
          float* at = &buf[(16 * mt + 8 * h + lane / 4) * kEpiStride + 8 * i + 2 * (lane % 4)];
          *reinterpret_cast<float2*>(at) = v;
        }
    __syncwarp();
    const int left = cols - pass * kEpiCols;
    store_staged<kEpiCols, 32>(epi, buf, kEpiStride, batch, row0, col0 + pass * kEpiCols, rows,
                               left < kEpiCols ? left : kEpiCols, lane);
    __syncwarp();
  }
}

template <class T, class OutT, class S, bool KA, bool KB>
__global__ void __launch_bounds__(S::kThreads, S::kMinBlocks)
    gemm_sm80_kernel(const Operand<T> a, const Operand<T> b,
                     const __grid_constant__ Epilogue<OutT> epi, const TileOrder order, int64_t m,
                     int64_t n) {
  extern __shared__ uint4 smem[];
  int64_t batch;
  int tm, tn;
  order.at(blockIdx.x, batch, tm, tn);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp % S::kWarpsM, wn = warp / S::kWarpsM;
  const int64_t row0 = int64_t(tm) * kBM, col0 = int64_t(tn) * S::BN;
  const WarpLoaders<S, KA, KB> ld{{wm * S::kWM, lane}, {wn * S::kWN, lane}};
  float acc[S::kMT][S::kNT][4] = {};
  mainloop<T, S>(acc, tile::smem_addr(smem), a, b, batch, row0, col0, ld);
  tile::cp_async_wait<0>();  // the epilogue reuses the ring: no copy may still land in it
  __syncthreads();     // ... nor any warp still read it
  float* buf = reinterpret_cast<float*>(smem) + warp * S::kWM * kEpiStride;
  store_tile<S>(epi, acc, buf, batch, row0 + wm * S::kWM, col0 + wn * S::kWN, m, n, lane);
}

// ---- host ---------------------------------------------------------------------------------------

// How an operand of `rows` rows (M or N) and `k` columns lies in memory: row stride `sr`, K stride
// `sk`, batch stride `sb` (0: shared). A stride along a dimension of extent 1 is never stepped.
struct OperandLayout {
  const void* p;
  int64_t rows, k, sr, sk, sb;
  // K contiguous, each row's start 16-byte aligned.
  bool k_major() const { return (sk == 1 || k == 1) && (sr % kChunk == 0 || rows == 1); }
  // Rows contiguous, each K's start 16-byte aligned.
  bool mn_major() const { return (sr == 1 || rows == 1) && (sk % kChunk == 0 || k == 1); }
  bool ok(int64_t batch) const {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0 && (sb % kChunk == 0 || batch == 1) &&
           (k_major() || mn_major());
  }
  template <class T>
  Operand<T> operand() const {
    return {static_cast<const T*>(p), rows, k, k_major() ? sr : sk, sb};
  }
};

OperandLayout layout_a(const GemmArgs& g) { return {g.a, g.m, g.k, g.a_sm, g.a_sk, g.a_sb}; }
OperandLayout layout_b(const GemmArgs& g) { return {g.b, g.n, g.k, g.b_sn, g.b_sk, g.b_sb}; }

TileOrder tile_order(const GemmArgs& g, int bn, int group) {
  TileOrder o;
  o.tiles_m = int((g.m + kBM - 1) / kBM);
  o.tiles_n = int((g.n + bn - 1) / bn);
  o.group = group;
  o.batch = g.batch;
  return o;
}

int64_t tile_count(const GemmArgs& g, int bn) {
  return ((g.m + kBM - 1) / kBM) * ((g.n + bn - 1) / bn) * g.batch;
}

template <class T, class OutT, class S, bool KA, bool KB>
void launch_typed(const GemmArgs& g, const Sm80Tier::Plan& p, cudaStream_t stream) {
  auto kernel = gemm_sm80_kernel<T, OutT, S, KA, KB>;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), S::kSmem);
  kernel<<<p.grid, S::kThreads, S::kSmem, stream>>>(
      layout_a(g).operand<T>(), layout_b(g).operand<T>(), Epilogue<OutT>::from(g),
      tile_order(g, S::BN, p.group), g.m, g.n);
  TESSERA_LAUNCH_CHECK();
}

template <class T, class S, bool KA, bool KB>
void launch_out(const GemmArgs& g, const Sm80Tier::Plan& p, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_typed<T, float, S, KA, KB>(g, p, stream);
  else launch_typed<T, T, S, KA, KB>(g, p, stream);
}

template <class T, class S>
void launch_layout(const GemmArgs& g, const Sm80Tier::Plan& p, cudaStream_t stream) {
  const bool ka = layout_a(g).k_major(), kb = layout_b(g).k_major();
  if (ka && kb) launch_out<T, S, true, true>(g, p, stream);
  else if (ka) launch_out<T, S, true, false>(g, p, stream);
  else if (kb) launch_out<T, S, false, true>(g, p, stream);
  else launch_out<T, S, false, false>(g, p, stream);
}

template <class S>
void launch_shape(const GemmArgs& g, const Sm80Tier::Plan& p, cudaStream_t stream) {
  if (g.dtype == DType::float16) launch_layout<__half, S>(g, p, stream);
  else launch_layout<__nv_bfloat16, S>(g, p, stream);
}

// The shapes as Plan::tile numbers them.
struct TileInfo {
  int bn, stages, warps;
};
template <class S>
constexpr TileInfo info() { return {S::BN, S::kStages, S::kThreads / 32}; }
constexpr TileInfo kTiles[] = {info<Square>(), info<Narrow>()};

// TESSERA_SM80_TILE=square or narrow forces a shape (for measuring them against each other);
// -1: the rule. Read once per process.
int forced_tile() {
  static const int forced = [] {
    const char* e = std::getenv("TESSERA_SM80_TILE");
    const std::string v = e ? e : "";
    return v == "square" ? 0 : v == "narrow" ? 1 : -1;
  }();
  return forced;
}

}  // namespace

std::string Sm80Tier::Plan::describe() const {
  const TileInfo& t = kTiles[tile];
  return std::to_string(kBM) + " x " + std::to_string(t.bn) + " tiles, " +
         std::to_string(t.stages) + " stages, " + std::to_string(t.warps) + " warps, grid " +
         std::to_string(grid.x) + " x " + std::to_string(grid.y) + " x " + std::to_string(grid.z);
}

bool Sm80Tier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  if (ctx.major < 8 || g.k <= 0) return false;
  if (is_gated(g.activation)) return false;  // the sm90 tier's alone (gemm.cuh)
  if (g.dtype != DType::bfloat16 && g.dtype != DType::float16) return false;
  if (g.out_dtype != g.dtype && g.out_dtype != DType::float32) return false;
  if (tile_count(g, Narrow::BN) > INT32_MAX || (g.k + kBK - 1) / kBK > INT32_MAX) return false;
  return layout_a(g).ok(g.batch) && layout_b(g).ok(g.batch);
}

Sm80Tier::Plan Sm80Tier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  Plan p;
  p.tile = forced_tile() >= 0 ? forced_tile() : tile_count(g, Square::BN) >= ctx.sms ? 0 : 1;
  p.group = g.config.group > 0 ? g.config.group : 8;
  p.grid = dim3(unsigned(tile_count(g, kTiles[p.tile].bn)), 1, 1);
  return p;
}

void Sm80Tier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  if (p.tile == 0) launch_shape<Square>(g, p, stream);
  else launch_shape<Narrow>(g, p, stream);
}

}  // namespace tessera::matrix
