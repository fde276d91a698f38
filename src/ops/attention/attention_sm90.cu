// The Hopper attention tier: FlashAttention's forward, warp-specialized, on TMA and wgmma.
//
// FLOPs against exponentials: a 128-query x 128-key tile at head_dim 128 is 4 * 128^3 FLOPs,
// about 2048 cycles of an SM's tensor cores, and 128^2 exponentials, 1024 cycles of its MUFU at
// 16 a cycle. The softmax must therefore run while the tensor cores multiply, not between their
// multiplies; HBM is no limit (K and V come from L2 for every query tile after the first).
//
// Roles (384 threads, 3 warpgroups, one CTA per 128 query rows of one head):
//   warpgroup 0    the producer: one thread loads Q once, then K and V tile by tile into a ring
//                  of stages (TMA, 128-byte swizzle), from the last key tile to the first so the
//                  masked tiles of a causal row come first
//   warpgroups 1,2 consumers of 64 query rows each, on the same K and V: S = Q K^T (wgmma, both
//                  operands in shared memory), the online softmax in float32 registers (exp2,
//                  the scale folded into one FMA), P re-entering the tensor cores from registers
//                  as bf16/fp16 for O += P V
// Overlap: within a warpgroup, S of tile j+1 is issued before P V of tile j, so the softmax of
// j+1 runs under that product; between the two, named barriers hand the tensor cores back and
// forth (FlashAttention-3's ping-pong), so one's softmax runs under the other's multiplies.
// Masks (causal, window, the end of the keys) are applied only on tiles that cross a boundary;
// ALiBi's bias, where given, on every tile, beside them.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/attention/attention.cuh"
#include "ops/attention/attention_sm90.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/tma.hpp"
#include "tile/activation.cuh"
#include "tile/bulk.cuh"
#include "tile/online_softmax.cuh"
#include "tile/smem.cuh"
#include "tile/sync.cuh"
#include "tile/tma.cuh"
#include "tile/wgmma.cuh"

namespace tessera::attn {
namespace sm90 {

constexpr int kBM = 128;  // query rows per CTA: 64 per consumer warpgroup
constexpr int kThreads = 384;
constexpr int kTurnBar = 1;  // named barriers 1, 2: consumer 0's and 1's turn at the tensor cores
constexpr int kEpiBar = 3;   // 3, 4: a consumer's epilogue

// Tile sizes per head dimension: a stage holds one key tile of K and one of V; key tiles shrink
// at 256 so that Q, two stages and the 64 x 256 accumulators fit.
template <int D_>
struct Shape {
  static constexpr int D = D_, kChunks = D / 64;  // 64-wide column blocks: the swizzle's 128 bytes
  static constexpr int BN = D <= 128 ? 128 : 64;
  static constexpr int kStages = D <= 64 ? 3 : 2;
};

// Each operand tile is [chunk][rows][64], 1024-byte aligned, as the copy engine writes it.
template <class T, class C>
struct alignas(1024) Smem {
  T q[C::kChunks][kBM * 64];
  T k[C::kStages][C::kChunks][C::BN * 64];
  T v[C::kStages][C::kChunks][C::BN * 64];
  uint64_t q_full, k_full[C::kStages], v_full[C::kStages], k_empty[C::kStages], v_empty[C::kStages];
};

struct Fwd {
  void* out;
  Strides so;
  float* lse;  // nullable
  int64_t lse_b, lse_h;
  int64_t seq_q, seq_k;
  const int32_t *cu_q, *cu_k;  // varlen: sequence offsets (seq_q, seq_k unused)
  int group, band;  // band: (head, sequence) pairs per band of the grid (tile_slowest)
  float scale, mul, softcap;  // mul: what takes a (capped) score to log2 units
  bool causal;
  int64_t window_left, window_right;
  const float* alibi;  // ALiBi (null: none): slope of (b, h) at b * alibi_b + h * alibi_h
  int64_t alibi_b, alibi_h;
};

// A CTA's share: its query rows of sequence b (rows q0 + m_block * kBM on of the tensors, the
// copy engine's batch coordinate tb), and the key tiles they see, [n_first, n_last] (none when
// n_last < n_first); tiles inside [lo_max, hi_min] need no mask for any of the rows.
struct Work {
  int m_block, h, b, tb;
  int64_t q0, k0, len_q, len_k;
  int n_first, n_last;
  int64_t lo_max, hi_min;
};

template <int BN>
__device__ Work work_of(const Fwd& f) {
  Work w;
  // Under a causal mask the last query tiles see the most keys: those of every head first.
  const GridPos g = tile_slowest(f.band);
  w.m_block = f.causal ? int(gridDim.x - 1 - g.x) : g.x;
  w.h = g.y, w.b = g.z;
  if (f.cu_q) {
    w.q0 = f.cu_q[w.b], w.k0 = f.cu_k[w.b], w.tb = 0;
    w.len_q = f.cu_q[w.b + 1] - w.q0, w.len_k = f.cu_k[w.b + 1] - w.k0;
  } else {
    w.q0 = w.k0 = 0, w.tb = w.b, w.len_q = f.seq_q, w.len_k = f.seq_k;
  }
  const int64_t r0 = int64_t(w.m_block) * kBM, r1 = min(r0 + kBM, w.len_q) - 1;
  if (r1 < r0) {  // a shorter sequence than the grid's longest
    w.n_first = 0, w.n_last = -1, w.lo_max = 0, w.hi_min = -1;
    return w;
  }
  const KeyRange a = key_range(r0, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
  const KeyRange z = key_range(r1, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
  w.n_first = int(a.lo / BN);
  w.n_last = z.hi < a.lo ? w.n_first - 1 : int(z.hi / BN);
  w.lo_max = z.lo, w.hi_min = a.hi;
  return w;
}

template <class T, class C>
__device__ void produce(Smem<T, C>& s, const CUtensorMap* mq, const CUtensorMap* mk,
                        const CUtensorMap* mv, const Work& w, int hk) {
  constexpr uint32_t kTileBytes = C::BN * C::D * sizeof(T);
  if (w.n_last < w.n_first) return;
  const tile::BulkBarrier qf{&s.q_full};
  qf.expect(kBM * C::D * sizeof(T));
#pragma unroll
  for (int c = 0; c < C::kChunks; ++c) tile::tma_load(s.q[c], mq, 64 * c, int(w.q0) + w.m_block * kBM, w.h, w.tb, qf);
  for (int n = w.n_last, it = 0; n >= w.n_first; --n, ++it) {
    const int st = it % C::kStages;
    const uint32_t ph = uint32_t(it / C::kStages) & 1;
    const tile::BulkBarrier kf{&s.k_full[st]}, ke{&s.k_empty[st]}, vf{&s.v_full[st]}, ve{&s.v_empty[st]};
    ke.wait(ph ^ 1);  // a fresh barrier's preceding phase counts as complete
    kf.expect(kTileBytes);
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) tile::tma_load(s.k[st][c], mk, 64 * c, int(w.k0) + n * C::BN, hk, w.tb, kf);
    ve.wait(ph ^ 1);
    vf.expect(kTileBytes);
#pragma unroll
    for (int c = 0; c < C::kChunks; ++c) tile::tma_load(s.v[st][c], mv, 64 * c, int(w.k0) + n * C::BN, hk, w.tb, vf);
  }
}

// S = Q K^T for the warpgroup's 64 rows (K-major operands, 16 of head_dim a step).
template <class T, class C>
__device__ __forceinline__ void issue_qk(Smem<T, C>& s, int st, int wg, float (&sc)[C::BN / 2]) {
  using Mma = tile::wgmma::Mma<T, C::BN, 0, 0>;
#pragma unroll
  for (int kk = 0; kk < C::D / 16; ++kk) {
    const int c = kk / 4, off = 2 * (kk % 4);
    Mma::run(sc, tile::wgmma::kmajor_sw128(&s.q[c][wg * 64 * 64]) + off,
             tile::wgmma::kmajor_sw128(&s.k[st][c][0]) + off, kk > 0);
  }
}

// O (+)= P V: P from registers, V MN-major (head_dim contiguous), 16 keys a step.
template <class T, class C>
__device__ __forceinline__ void issue_pv(Smem<T, C>& s, int st, const uint32_t (&pr)[C::BN / 16][4],
                                         float (&o)[C::D / 2], bool accumulate) {
  using Mma = tile::wgmma::MmaRS<T, C::D, 1>;
#pragma unroll
  for (int kk = 0; kk < C::BN / 16; ++kk)
    Mma::run(o, pr[kk], tile::wgmma::mnmajor_sw128(&s.v[st][0][0], C::BN * 128) + 128 * kk,
             accumulate || kk > 0);
}

// ALiBi for a thread's two rows, in the units scores_to_p holds the scores in: q.k without a
// soft-cap (the scale comes later, in mul: so the slope is divided by it), the capped score with
// one. Slope 0: none.
struct Alibi {
  float slope;
  int diag[2];  // the rows' diagonals, i + len_k - len_q (the launcher keeps lengths below 2^30)
};

template <int N>
__device__ __forceinline__ void mask_tile(float (&sc)[N], int64_t key0, const int64_t (&lo)[2],
                                          const int64_t (&hi)[2], int lane) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const int64_t key = key0 + col_of(j, lane);
    if (key < lo[row_of(j)] || key > hi[row_of(j)]) sc[j] = -INFINITY;
  }
}

// The online softmax over one tile: new row maxima m (in score units), the factor corr that
// rescales what was summed so far, P = exp2(mul (s - m)) in place of the scores, and l the
// thread's part of the row sums. A row with nothing unmasked yet keeps m = -inf and P = 0.
template <int N>
__device__ __forceinline__ void online_softmax(float (&sc)[N], float (&m)[2], float (&l)[2],
                                               float (&corr)[2], float mul) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float mx = m[r];
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (row_of(j) == r) mx = fmaxf(mx, sc[j]);
    mx = quad_reduce(mx, tile::MaxNum{});
    const float ms = mx == -INFINITY ? 0.f : mx * mul;
    corr[r] = tile::rescale<tile::Base::two>(m[r] * mul, ms);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (row_of(j) == r) {
        sc[j] = tile::ex2_approx(fmaf(sc[j], mul, -ms));
        sum += sc[j];
      }
    l[r] = l[r] * corr[r] + sum;
    m[r] = mx;
  }
}

// Normalizes O and writes it (staged through the warpgroup's own rows of Q's shared memory), and
// the rows' lse.
template <class T, class C>
__device__ void store_out(Smem<T, C>& s, const Fwd& f, const Work& w, float (&o)[C::D / 2],
                          const float (&m)[2], float (&l)[2], int wg) {
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int64_t row_base = int64_t(w.m_block) * kBM + wg * 64;
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_reduce(l[r], tile::Sum{});
    inv[r] = l[r] > 0.f ? 1.f / l[r] : 0.f;
    const int64_t row = row_base + warp * 16 + lane / 4 + 8 * r;
    if (f.lse && lane % 4 == 0 && row < w.len_q)
      f.lse[w.b * f.lse_b + w.h * f.lse_h + w.q0 + row] = l[r] > 0.f ? (m[r] * f.mul + log2f(l[r])) * kLn2 : INFINITY;
  }
  T* out = static_cast<T*>(f.out) + w.b * f.so.b + w.h * f.so.h + (w.q0 + row_base) * f.so.s;
  store_tile<T, C::D>(&s.q[0][0], kBM, wg * 64, o, inv, out, f.so.s, w.len_q - row_base, kEpiBar + wg);
}

// Tile `it` (key tile n_last - it) from scores to P: the soft-cap, ALiBi's bias, the masks where
// the tile crosses a boundary, the online softmax.
template <int BN>
__device__ __forceinline__ void scores_to_p(float (&sc)[BN / 2], const Fwd& f, const Work& w, int it,
                                            const int64_t (&lo)[2], const int64_t (&hi)[2], const Alibi& al,
                                            float (&m)[2], float (&l)[2], float (&corr)[2], int lane) {
  const int64_t key0 = int64_t(w.n_last - it) * BN;
  if (f.softcap > 0.f) {
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) sc[j] = f.softcap * tanhf(sc[j] * f.scale / f.softcap);
  }
  if (al.slope != 0.f) {
    const TileBias bias = tile_bias(al.slope, int(key0), al.diag, lane);
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) sc[j] += bias.at(j);
  }
  if (key0 < w.lo_max || key0 + BN - 1 > w.hi_min) mask_tile(sc, key0, lo, hi, lane);
  online_softmax(sc, m, l, corr, f.mul);
}

// A consumer warpgroup. Iteration `it` issues S of tile it and P V of tile it - 1, then computes
// tile it's softmax while P V runs; the first S and the last P V stand outside the loop, so that
// every multiply is issued on a path the compiler sees all of the warpgroup take (a multiply
// under a branch is serialized with its neighbours). Each issue waits for the warpgroup's turn.
template <class T, class C>
__device__ void consume(Smem<T, C>& s, const Fwd& f, const Work& w, int wg) {
  constexpr int BN = C::BN, kS = C::kStages;
  const int tid = threadIdx.x % 128, lane = tid % 32;
  const int64_t row0 = int64_t(w.m_block) * kBM + wg * 64 + (tid / 32) * 16 + lane / 4;
  int64_t lo[2], hi[2];
  Alibi al{f.alibi ? f.alibi[w.b * f.alibi_b + w.h * f.alibi_h] / (f.softcap > 0.f ? 1.f : f.scale) : 0.f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const KeyRange kr = key_range(row0 + 8 * r, w.len_q, w.len_k, f.causal, f.window_left, f.window_right);
    lo[r] = kr.lo, hi[r] = kr.hi, al.diag[r] = int(row0 + 8 * r + w.len_k - w.len_q);
  }
  float o[C::D / 2], sc[BN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, corr[2];
  uint32_t pr[BN / 16][4];
#pragma unroll
  for (int j = 0; j < C::D / 2; ++j) o[j] = 0.f;
  const int tiles = w.n_last - w.n_first + 1;
  const auto full = [&](uint64_t* bar, int it) { tile::BulkBarrier{bar}.wait(uint32_t(it / kS) & 1); };
  const auto release = [&](uint64_t* bar) { if (tid == 0) tile::BulkBarrier{bar}.arrive(); };
  const auto my_turn = [&] { tile::group_sync(kTurnBar + wg, 256); };
  const auto your_turn = [&] { tile::group_arrive(kTurnBar + 1 - wg, 256); };
  if (tiles > 0) {
    tile::BulkBarrier{&s.q_full}.wait(0);
    if (wg == 1) tile::group_arrive(kTurnBar, 256);  // consumer 0 goes first
    full(&s.k_full[0], 0);
    my_turn();
    tile::wgmma::fence();
    issue_qk(s, 0, wg, sc);
    tile::wgmma::commit();
    your_turn();
    tile::wgmma::wait<0>();
    tile::wgmma::fence_operands(sc);
    release(&s.k_empty[0]);
    scores_to_p<BN>(sc, f, w, 0, lo, hi, al, m, l, corr, lane);
    pack_a<T, BN>(sc, pr);
    for (int it = 1; it < tiles; ++it) {
      const int st = it % kS, pst = (it - 1) % kS;
      full(&s.k_full[st], it);
      full(&s.v_full[pst], it - 1);
      my_turn();
      tile::wgmma::fence();
      issue_qk(s, st, wg, sc);
      tile::wgmma::commit();
      issue_pv(s, pst, pr, o, it > 1);
      tile::wgmma::commit();
      your_turn();
      tile::wgmma::wait<1>();
      tile::wgmma::fence_operands(sc);
      release(&s.k_empty[st]);
      scores_to_p<BN>(sc, f, w, it, lo, hi, al, m, l, corr, lane);
      tile::wgmma::wait<0>();
      tile::wgmma::fence_operands(o);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) tile::wgmma::fence_operands(pr[kk]);
      release(&s.v_empty[pst]);
#pragma unroll
      for (int j = 0; j < C::D / 2; ++j) o[j] *= corr[row_of(j)];
      pack_a<T, BN>(sc, pr);
    }
    const int pst = (tiles - 1) % kS;
    full(&s.v_full[pst], tiles - 1);
    my_turn();
    tile::wgmma::fence();
    issue_pv(s, pst, pr, o, tiles > 1);
    tile::wgmma::commit();
    if (wg == 0) your_turn();  // consumer 1 has had its last turn
    tile::wgmma::wait<0>();
    tile::wgmma::fence_operands(o);
    release(&s.v_empty[pst]);
  }
  store_out(s, f, w, o, m, l, wg);
}

template <class T, class C>
__global__ void __launch_bounds__(kThreads, 1)
    attention_sm90_kernel(const __grid_constant__ CUtensorMap mq, const __grid_constant__ CUtensorMap mk,
                          const __grid_constant__ CUtensorMap mv, const Fwd f) {
  extern __shared__ unsigned char smem_raw[];
  auto& s = tile::aligned_smem<Smem<T, C>, 1024>(smem_raw);
  const Work w = work_of<C::BN>(f);
  if (threadIdx.x == 0) {
    tile::tma_prefetch(&mq);
    tile::tma_prefetch(&mk);
    tile::tma_prefetch(&mv);
    tile::BulkBarrier{&s.q_full}.init(1);
    for (int i = 0; i < C::kStages; ++i) {
      tile::BulkBarrier{&s.k_full[i]}.init(1);
      tile::BulkBarrier{&s.v_full[i]}.init(1);
      tile::BulkBarrier{&s.k_empty[i]}.init(2);
      tile::BulkBarrier{&s.v_empty[i]}.init(2);
    }
    tile::bulk_barriers_ready();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    tile::wgmma::release_registers<24>();
    if (threadIdx.x == 0) produce(s, &mq, &mk, &mv, w, w.h / f.group);
  } else {
    tile::wgmma::claim_registers<240>();
    consume(s, f, w, int(threadIdx.x / 128) - 1);
  }
}

template <class T, class C>
const void* kernel_of() {
  return reinterpret_cast<const void*>(attention_sm90_kernel<T, C>);
}

struct Maps {
  runtime::TmaShape q, k, v;
};

template <int BN>
Maps maps_of(const Params& p) {
  const int64_t heads_kv = p.heads_q / p.group, batch = p.cu_q ? 1 : p.batch;
  const int64_t rows_q = p.cu_q ? p.total_q : p.seq_q, rows_k = p.cu_q ? p.total_k : p.seq_k;
  return {shape_of(p.sq, batch, rows_q, p.heads_q, p.dim, kBM), shape_of(p.sk, batch, rows_k, heads_kv, p.dim, BN),
          shape_of(p.sv, batch, rows_k, heads_kv, p.dim, BN)};
}

// A CTA per 128 query rows of a head of a sequence (the longest, for packed sequences).
dim3 grid_of(const Params& p) {
  return dim3(unsigned((p.seq_q + kBM - 1) / kBM), unsigned(p.heads_q), unsigned(p.batch));
}

template <class T, int D>
void launch_typed(const Params& p, cudaStream_t stream) {
  using C = Shape<D>;
  const Maps mp = maps_of<C::BN>(p);
  const CUtensorMap mq = runtime::tma_map("attention", p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128);
  const CUtensorMap mk = runtime::tma_map("attention", p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128);
  const CUtensorMap mv = runtime::tma_map("attention", p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128);
  Fwd f{};
  f.out = p.out, f.so = p.so, f.lse = p.lse, f.lse_b = p.lse_b, f.lse_h = p.lse_h;
  f.seq_q = p.seq_q, f.seq_k = p.seq_k, f.cu_q = p.cu_q, f.cu_k = p.cu_k, f.group = int(p.group);
  f.scale = p.scale, f.softcap = p.softcap, f.mul = (p.softcap > 0 ? 1.f : p.scale) * kLog2e;
  f.causal = p.causal, f.window_left = p.window_left, f.window_right = p.window_right;
  f.alibi = p.alibi, f.alibi_b = p.alibi_b, f.alibi_h = p.alibi_h;
  const dim3 grid = grid_of(p);
  f.band = band_of(grid, p.device);
  const std::size_t smem = sizeof(Smem<T, C>) + 1024;
  auto kernel = attention_sm90_kernel<T, C>;
  runtime::allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  kernel<<<grid, kThreads, smem, stream>>>(mq, mk, mv, f);
  TESSERA_LAUNCH_CHECK();
}

}  // namespace sm90

bool Sm90Tier::can_implement(const Params& p, const TierCtx& c) {
  using namespace sm90;
  if (!c.allows(AttentionTier::sm90)) return false;
  if (p.dtype != DType::bfloat16 && p.dtype != DType::float16) return false;
  if (p.dim != p.dim_v || (p.dim != 64 && p.dim != 128 && p.dim != 256)) return false;
  if (p.len_k) return false;  // a KV cache: the decode and generic tiers
  if (runtime::device_props(p.device).major != 9 ||
      !runtime::has_sm90a_code(kernel_of<__nv_bfloat16, Shape<128>>()))
    return false;
  if (p.heads_q > 65535 || p.batch > 65535 || std::max({p.seq_q, p.seq_k, p.total_q, p.total_k}) > INT32_MAX / 2)
    return false;
  // The output is written 16 bytes a thread.
  const auto aligned = [](int64_t s) { return s % 8 == 0; };
  if (p.so.d != 1 || reinterpret_cast<uintptr_t>(p.out) % 16 != 0 || !aligned(p.so.s) || !aligned(p.so.h) ||
      !aligned(p.so.b))
    return false;
  const Maps mp = p.dim == 256 ? maps_of<Shape<256>::BN>(p) : maps_of<Shape<128>::BN>(p);
  return runtime::tma_can_map(p.dtype, p.q, mp.q, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.k, mp.k, runtime::TmaSwizzle::b128) &&
         runtime::tma_can_map(p.dtype, p.v, mp.v, runtime::TmaSwizzle::b128);
}

Sm90Tier::Plan Sm90Tier::plan(const Params& p, const TierCtx&) {
  Plan plan;
  with_head_dim(p.dim, [&](auto d) {
    using C = sm90::Shape<decltype(d)::value>;
    plan.block_n = C::BN, plan.stages = C::kStages;
  });
  plan.grid = sm90::grid_of(p);
  return plan;
}

std::string Sm90Tier::Plan::describe() const {
  return std::to_string(sm90::kBM) + " query rows a CTA (two consumer warpgroups of 64), key tiles of " +
         std::to_string(block_n) + ", " + std::to_string(stages) + " stages, grid " + std::to_string(grid.x) + " x " +
         std::to_string(grid.y) + " x " + std::to_string(grid.z);
}

void Sm90Tier::launch(const Params& p, const Plan&, cudaStream_t stream) {
  with_head_dim(p.dim, [&](auto d) {
    if (p.dtype == DType::float16) sm90::launch_typed<__half, d>(p, stream);
    else sm90::launch_typed<__nv_bfloat16, d>(p, stream);
  });
}

}  // namespace tessera::attn
