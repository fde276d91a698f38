// Skinny GEMMs: C = A W^T with few rows M (decode, small batches) and W [N, K] with K contiguous,
// the layout of a linear layer's weight. The product does 2 M N K FLOPs on N K 2 bytes of W, which
// is read once: at M <= 32 that is at most 32 FLOPs a byte, under what the tensor cores do at the
// copy rate, so the time is the weight's bytes over the copy rate and the kernel's one job is to
// keep enough of W in flight on every SM.
//
// Shape of the work: a CTA of 4 warps takes 64 rows of W (64 output columns) over one chunk of K;
// where those column blocks are too few to fill the GPU several times over, K is split into
// chunks. Each lane streams 16-byte runs of two W rows (8 values of K each), several runs ahead,
// and multiplies them on mma.sync m16n8k16 against A staged in shared memory; the 16 K positions
// of a step are assigned to lanes in the order the 16-byte runs land (tile/mma.cuh), A read from
// shared memory in that same order. A chunk's A rows (M padded to 16 or 32 with zeros) are staged
// a piece of K at a time.
//
// Split K: each CTA writes its float32 partial sums to scratch and counts itself done on its column
// block's counter; the last to arrive adds the partials in chunk order (so the same bits every
// run, whichever arrives last), applies the epilogue and sets the counter back to zero (the
// counters are lent zero by runtime::zeroed_counters, with no memset a call).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "ops/matrix/gemm.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "tile/mma.cuh"
#include "tile/sync.cuh"
#include "tile/vec.cuh"

namespace tessera::matrix {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 16;               // two n8 tiles of W rows per warp
constexpr int kRows = kWarps * kRowsPerWarp;  // W rows (output columns) per CTA
constexpr int kRun = 8;                        // K values per 16-byte run
constexpr int kStep = 32;                      // K per lane-quad step: 4 lanes x one run
constexpr int kUnroll = 8;                     // steps in flight per lane
constexpr int kMinChunk = 256;                 // K per split at least
constexpr int kResident = 4;                   // CTAs an SM holds (__launch_bounds__)
constexpr int kMaxM = 32;
constexpr int kStagedBytes = 16384;            // A staged per piece of K
constexpr int kStagedLd = kRowsPerWarp + 4;    // the epilogue's rows of a warp's outputs (floats)

struct SkinnyArgs {
  const void* a;
  int64_t a_sm, a_sk;
  bool a_vec;  // A's K contiguous and its rows 16-byte aligned: staged in 16-byte runs
  const void* w;
  int64_t w_sn;
  int64_t m, n, k, chunk;
  int splits;
  float* partial;      // splits > 1: [splits][m][n]
  unsigned* counters;  // splits > 1: one per column block, zero at launch and left zero
};

// A's rows [0, 16 MT) x K [k0, k0 + Piece) into shared `xs` (row pitch Pitch), zeros past M and
// past `kend`.
template <class T, int MT, int Piece, int Pitch>
__device__ __forceinline__ void stage_a(T* xs, const SkinnyArgs& p, int64_t k0, int64_t kend) {
  const T* a = static_cast<const T*>(p.a);
  constexpr int kRunsPerRow = Piece / kRun;
  if (p.a_vec) {
    for (int i = threadIdx.x; i < 16 * MT * kRunsPerRow; i += kThreads) {
      const int r = i / kRunsPerRow, c = i % kRunsPerRow * kRun;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < p.m && k0 + c < kend) v = *reinterpret_cast<const uint4*>(a + r * p.a_sm + k0 + c);
      *reinterpret_cast<uint4*>(xs + r * Pitch + c) = v;
    }
  } else {
    for (int i = threadIdx.x; i < 16 * MT * Piece; i += kThreads) {
      const int r = i / Piece, c = i % Piece;
      xs[r * Pitch + c] = r < p.m && k0 + c < kend ? a[r * p.a_sm + (k0 + c) * p.a_sk] : T{};
    }
  }
}

// acc[mt][nt] += the products of one piece: `len` K values of A in `xs` against this lane's W rows.
template <class T, int MT, int Pitch>
__device__ __forceinline__ void multiply_piece(float (&acc)[MT][2][4], const T* xs, const T* w_rows,
                                               const bool (&row_ok)[2], int64_t w_sn, int64_t k0,
                                               int len, int64_t kend) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int kb = 0; kb < len; kb += kStep * kUnroll) {
    uint4 wv[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const int64_t col = k0 + kb + kStep * u + kRun * t;
        wv[u][nt] = row_ok[nt] && col < kend ? tile::load_16B_stream(w_rows + nt * 8 * w_sn + col)
                                             : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int c = kb + kStep * u + kRun * t;
        const uint4 lo = *reinterpret_cast<const uint4*>(xs + (16 * mt + g) * Pitch + c);
        const uint4 hi = *reinterpret_cast<const uint4*>(xs + (16 * mt + g + 8) * Pitch + c);
        // The run's 8 K values: the first 4 are one m16n8k16 step, the last 4 the next.
        const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const uint32_t b0[2] = {wv[u][nt].x, wv[u][nt].y}, b1[2] = {wv[u][nt].z, wv[u][nt].w};
          tile::mma_m16n8k16<T>(acc[mt][nt], a0, b0);
          tile::mma_m16n8k16<T>(acc[mt][nt], a1, b1);
        }
      }
  }
}

// The lane's outputs: f(m, n, i) for each pair (rows 16 mt + g + 8 h, columns n0 + 8 nt + 2 t and
// the next) in range, i the index of the pair's first value in the accumulators taken flat.
template <int MT, class F>
__device__ __forceinline__ void for_outputs(int64_t m, int64_t n, int64_t n0, F&& f) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = 16 * mt + g + 8 * h, c = n0 + 8 * nt + 2 * t;
        if (r < m && c < n) f(r, c, 8 * mt + 4 * nt + 2 * h);
      }
}

template <int MT>
__device__ __forceinline__ float* flat(float (&acc)[MT][2][4]) { return &acc[0][0][0]; }

template <class T, class OutT, int MT>
__global__ void __launch_bounds__(kThreads, kResident)
    skinny_kernel(const SkinnyArgs p, const __grid_constant__ Epilogue<OutT> epi) {
  constexpr int kPiece = kStagedBytes / (16 * MT * int(sizeof(T)));
  // Rows 64 bytes apart modulo 128: the 8 lanes of one 16-byte shared read (two rows, four runs
  // each) fall on distinct banks.
  constexpr int kPitch = kPiece + 64 / int(sizeof(T));
  __shared__ alignas(16) T xs[16 * MT * kPitch];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int64_t n0 = int64_t(blockIdx.x) * kRows + warp * kRowsPerWarp;
  const int split = blockIdx.y;
  const int64_t kbeg = split * p.chunk, kend = kbeg + p.chunk < p.k ? kbeg + p.chunk : p.k;
  const T* w_rows = static_cast<const T*>(p.w) + (n0 + g) * p.w_sn;
  const bool row_ok[2] = {n0 + g < p.n, n0 + 8 + g < p.n};

  float acc[MT][2][4] = {};
  for (int64_t k0 = kbeg; k0 < kend; k0 += kPiece) {
    __syncthreads();  // the previous piece's reads are done
    stage_a<T, MT, kPiece, kPitch>(xs, p, k0, kend);
    __syncthreads();
    multiply_piece<T, MT, kPitch>(acc, xs, w_rows, row_ok, p.w_sn, k0,
                                  int(kend - k0 < kPiece ? kend - k0 : kPiece), kend);
  }

  float* v = flat(acc);
  if (p.splits > 1) {
    float* mine = p.partial + split * p.m * p.n;
    for_outputs<MT>(p.m, p.n, n0, [&](int64_t r, int64_t c, int i) {
      mine[r * p.n + c] = v[i];
      if (c + 1 < p.n) mine[r * p.n + c + 1] = v[i + 1];
    });
    if (!tile::last_to_arrive(&p.counters[blockIdx.x], unsigned(p.splits))) return;
    // The sum in chunk order, this CTA's own chunk from its registers (the same values it wrote).
    // Each chunk's partials are loaded together before they are added: one L2 round trip a
    // chunk, not one an output.
    float sum[MT][2][4] = {}, part[MT][2][4];
    float *total = flat(sum), *q = flat(part);
    for (int s = 0; s < p.splits; ++s) {
      for_outputs<MT>(p.m, p.n, n0, [&](int64_t r, int64_t c, int i) {
        const float* from = p.partial + (s * p.m + r) * p.n + c;
        q[i] = s == split ? v[i] : __ldcg(from);
        q[i + 1] = s == split || c + 1 >= p.n ? v[i + 1] : __ldcg(from + 1);
      });
      for_outputs<MT>(p.m, p.n, n0, [&](int64_t, int64_t, int i) { total[i] += q[i], total[i + 1] += q[i + 1]; });
    }
    for_outputs<MT>(p.m, p.n, n0, [&](int64_t, int64_t, int i) { v[i] = total[i], v[i + 1] = total[i + 1]; });
  }
  // The epilogue through shared memory (xs, free once every warp is past its last piece): each
  // warp stages its 16 MT x 16 outputs and stores them from there (store_staged), so that each
  // activation's code appears once, not once per accumulator pair.
  static_assert(kWarps * 16 * MT * kStagedLd * int(sizeof(float)) <= int(sizeof(xs)),
                "the warps' outputs fit in xs");
  __syncthreads();
  if (n0 >= p.n) return;
  float* buf = reinterpret_cast<float*>(xs) + warp * 16 * MT * kStagedLd;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(&buf[(16 * mt + g + 8 * h) * kStagedLd + 8 * nt + 2 * (lane % 4)]) =
            make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
  __syncwarp();
  store_staged<kRowsPerWarp, 32>(epi, buf, kStagedLd, 0, 0, n0, int(p.m),
                                 p.n - n0 < kRowsPerWarp ? int(p.n - n0) : kRowsPerWarp, lane);
}

bool is_16bit(DType dt) { return dt == DType::bfloat16 || dt == DType::float16; }

template <class T, class OutT>
void launch_typed(const GemmArgs& g, const SkinnyTier::Plan& p, const SkinnyArgs& args, cudaStream_t stream) {
  const dim3 grid(unsigned(p.blocks), unsigned(p.splits));
  const auto epi = Epilogue<OutT>::from(g);
  if (p.m_tiles == 1) skinny_kernel<T, OutT, 1><<<grid, kThreads, 0, stream>>>(args, epi);
  else skinny_kernel<T, OutT, 2><<<grid, kThreads, 0, stream>>>(args, epi);
  TESSERA_LAUNCH_CHECK();
}

template <class T>
void launch_out(const GemmArgs& g, const SkinnyTier::Plan& p, const SkinnyArgs& args, cudaStream_t stream) {
  if (g.out_dtype == DType::float32) launch_typed<T, float>(g, p, args, stream);
  else launch_typed<T, T>(g, p, args, stream);
}

}  // namespace

std::string SkinnyTier::Plan::describe() const {
  return std::to_string(blocks) + " blocks of " + std::to_string(kRows) + " columns x " +
         std::to_string(splits) + " chunks of K = " + std::to_string(chunk) + ", M padded to " +
         std::to_string(16 * m_tiles);
}

bool SkinnyTier::can_implement(const GemmArgs& g, const GemmCtx& ctx) {
  // An explicit config names the sm90 tiers' choices: tuning may then prefer them.
  if (ctx.major < 8 || !(g.config == GemmConfig{}) || g.batch != 1 || g.m > kMaxM || g.k == 0)
    return false;
  if (is_gated(g.activation)) return false;  // the sm90 tier's alone (gemm.cuh)
  if (!is_16bit(g.dtype) || (g.out_dtype != g.dtype && g.out_dtype != DType::float32)) return false;
  const int64_t e = int64_t(dtype_size(g.dtype));
  return g.b_sk == 1 && g.k % kRun == 0 && g.b_sn * e % 16 == 0 &&
         reinterpret_cast<uintptr_t>(g.b) % 16 == 0 && g.n <= int64_t(INT32_MAX) * kRows;
}

// K split where the column blocks would leave SMs short of CTAs: as many chunks as still fit in one
// wave of kResident CTAs an SM (a second, partial wave would stream at a fraction of the rate), each
// kMinChunk of K at least, a multiple of one loop iteration.
SkinnyTier::Plan SkinnyTier::plan(const GemmArgs& g, const GemmCtx& ctx) {
  Plan p;
  p.m_tiles = g.m <= 16 ? 1 : 2;
  p.blocks = runtime::ceil_div(g.n, kRows);
  const int64_t wave = kResident * int64_t(ctx.sms);
  const int64_t splits = std::max<int64_t>(1, std::min(wave / p.blocks, g.k / kMinChunk));
  p.chunk = runtime::ceil_div(runtime::ceil_div(g.k, splits), kStep * kUnroll) * (kStep * kUnroll);
  p.splits = int(runtime::ceil_div(g.k, p.chunk));
  return p;
}

void SkinnyTier::launch(const GemmArgs& g, const Plan& p, cudaStream_t stream) {
  const int64_t e = int64_t(dtype_size(g.dtype));
  SkinnyArgs args{};
  args.a = g.a, args.a_sm = g.a_sm, args.a_sk = g.a_sk;
  args.a_vec = g.a_sk == 1 && g.a_sm * e % 16 == 0 && reinterpret_cast<uintptr_t>(g.a) % 16 == 0;
  args.w = g.b, args.w_sn = g.b_sn;
  args.m = g.m, args.n = g.n, args.k = g.k, args.chunk = p.chunk, args.splits = p.splits;
  const runtime::SplitScratch split(p.splits, std::size_t(p.splits * g.m * g.n), std::size_t(p.blocks), stream);
  args.partial = split.partials();
  args.counters = split.counters<unsigned>();
  if (g.dtype == DType::float16) launch_out<__half>(g, p, args, stream);
  else launch_out<__nv_bfloat16>(g, p, args, stream);
}

}  // namespace tessera::matrix
