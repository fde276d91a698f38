// The decode tier of attention: a few queries against a long key sequence (generation with a KV
// cache), split over the keys (flash-decoding) so that batch 1 fills the GPU.
//
// Bytes: the call must read K and V once, 2 seq_k heads_kv head_dim elements, and does 4 flops
// per element read per query: memory-bound, so the work is split into enough CTAs to keep HBM
// busy (several per SM), each streaming one chunk of keys with 16-byte loads. A group of
// head_dim / 8 lanes holds one key row (8 elements a lane), so a warp walks 256 / head_dim keys at
// once, each group with its own online softmax; the groups, then the warps, are merged through
// shared memory into the chunk's partial (unnormalized O, row max, row sum), and a second kernel
// merges the chunks of each query row and writes out and lse. A CTA takes up to 8 query rows that
// share a KV head (a GQA group's heads, a sequence's queries), so each key row crosses from memory
// once for all of them rather than once per query head.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/attention/attention.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tuner.hpp"
#include "tile/activation.cuh"
#include "tile/constants.cuh"
#include "tile/convert.cuh"
#include "tile/frag.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"

namespace tessera::attn {
namespace decode {

constexpr int kWarps = 4;
constexpr int kMaxQueries = 16;  // seq_q this tier takes
using tile::kLog2e, tile::kLn2;

struct Split {
  float* o;  // [rows, splits, D] unnormalized partial outputs
  float* ml;  // [rows, splits, 2] each partial's max (log2 units) and sum
  int splits, chunk;
  int64_t row_blocks;  // CTAs per KV head: ceil(group x seq_q / R)
};

// A lane's 8 elements of a row (16 bytes, aligned) as floats.
template <class T>
__device__ __forceinline__ void load_row8(float (&r)[8], const T* p) {
  tile::unpack(tile::load_frag<T, 8>(p), r);
}

// The R query rows of a CTA: rows rho = first .. first + R - 1 of the group x seq_q rows that
// share KV head hk (rho = i * group + g: query i of head hk * group + g), so that each key row is
// loaded once for all of them (GQA heads, and the queries of one sequence).
struct Rows {
  int64_t first, count;  // count: the group x seq_q rows of the KV head
  __device__ int64_t head(const Params& p, int64_t hk, int r) const { return hk * p.group + (first + r) % p.group; }
  __device__ int64_t query(const Params& p, int r) const { return (first + r) / p.group; }
};

// The end of decode_split_kernel: each key group's (acc, m, l) of its rows through shared memory,
// merged into the chunk's partial of each row (unnormalized O, max, sum); a KV cache's bad entry
// (`bad`) carries NaN into out and lse.
template <int D, int R, int G>
__device__ __forceinline__ void merge_groups(float (&s_o)[kWarps * G][R][D], float (&s_ml)[kWarps * G][R][2],
                                             const float (&acc)[R][8], const float (&m)[R], const float (&l)[R],
                                             bool bad, int g, int sub, const Rows& rows, const Params& p,
                                             const Split& sp, int64_t len_q, int64_t b, int64_t hk) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int d = 0; d < 8; ++d) s_o[g][r][8 * sub + d] = acc[r][d];
    if (sub == 0) s_ml[g][r][0] = m[r], s_ml[g][r][1] = bad ? NAN : l[r];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < R * D; x += kWarps * 32) {
    const int r = x / D, d = x % D;
    const int64_t i = rows.query(p, r);
    if (rows.first + r >= rows.count || i >= len_q) continue;
    float mx = -INFINITY;
    for (int y = 0; y < kWarps * G; ++y) mx = fmaxf(mx, s_ml[y][r][0]);
    float o = 0.f, sum = 0.f;
    for (int y = 0; y < kWarps * G; ++y) {
      const float w = tile::merge_weight<tile::Base::two>(s_ml[y][r][0], mx);
      o += w * s_o[y][r][d], sum += w * s_ml[y][r][1];
    }
    const int64_t at = ((b * p.heads_q + rows.head(p, hk, r)) * p.seq_q + i) * sp.splits + blockIdx.x;
    sp.o[at * D + d] = o;
    if (d == 0) sp.ml[2 * at] = mx, sp.ml[2 * at + 1] = sum;
  }
}

// Query rows of CTA (split blockIdx.x, KV head and row block blockIdx.y, batch blockIdx.z) against
// chunk blockIdx.x of their keys. Alibi: ALiBi's bias, whose per-row state (2 R registers) would
// cost calls without it a spill at R = 4.
template <class T, int D, int R, bool Alibi>
__global__ void __launch_bounds__(kWarps * 32, R == 1 ? 8 : R == 2 ? 5 : R == 4 ? 4 : 2)
decode_split_kernel(Params p, Split sp) {
  constexpr int L = D / 8, G = 32 / L;  // lanes per key, keys per warp step
  __shared__ float s_o[kWarps * G][R][D];
  __shared__ float s_ml[kWarps * G][R][2];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, grp = lane / L, sub = lane % L;
  const int64_t b = blockIdx.z, hk = blockIdx.y / sp.row_blocks;
  const Rows rows{int64_t(blockIdx.y % sp.row_blocks) * R, p.group * p.seq_q};
  const Seq sq = seq_of(p, b);
  const float mul = (p.softcap > 0.f ? 1.f : p.scale) * kLog2e;
  float q[R][8], acc[R][8], m[R], l[R];
  int32_t lo[R], hi[R];  // each row's keys; the host keeps seq_k below 2^31
  float al[R];  // ALiBi: a row's bias against key j is -al |dg - j| in log2 units
  int32_t dg[R];  // the row's diagonal, below 2^31 as the keys are
  // The key loop counts in int32 (keys are below 2^30): a 64-bit index costs the kernels of 4 rows
  // a spill. No row with keys: an empty loop.
  int32_t lo_all = INT32_MAX / 2, hi_all = -1;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t i = rows.query(p, r);
    KeyRange kr{0, -1};
    if (rows.first + r < rows.count && i < sq.len_q) {
      load_row8(q[r], static_cast<const T*>(p.q) + b * p.sq.b + (sq.q0 + i) * p.sq.s + rows.head(p, hk, r) * p.sq.h + 8 * sub);
      kr = key_range(i, sq.len_q, sq.len_k, p.causal, p.window_left, p.window_right);
    }
    lo[r] = int32_t(kr.lo), hi[r] = int32_t(kr.hi), m[r] = -INFINITY, l[r] = 0.f;
    if (Alibi) {
      al[r] = p.alibi[b * p.alibi_b + rows.head(p, hk, r) * p.alibi_h] * kLog2e;
      dg[r] = int32_t(i + sq.len_k - sq.len_q);
    }
    if (hi[r] >= lo[r]) lo_all = min(lo_all, lo[r]), hi_all = max(hi_all, hi[r]);
#pragma unroll
    for (int d = 0; d < 8; ++d) acc[r][d] = 0.f;
  }
  const int32_t j_lo = max(lo_all, int32_t(blockIdx.x) * sp.chunk), j_hi = min(hi_all, int32_t(blockIdx.x + 1) * sp.chunk - 1);
  const T* k = static_cast<const T*>(p.k) + hk * p.sk.h + 8 * sub;
  const T* v = static_cast<const T*>(p.v) + hk * p.sv.h + 8 * sub;
  bool bad = sq.bad;  // a KV cache's length or block id out of range: the rows become NaN
  // The warp steps together (its shuffles need every lane); a group past the chunk's end adds
  // nothing. One key step a loop: the registers of more would cost CTAs per SM, which hold as
  // many loads in flight.
  for (int32_t j0 = j_lo + warp * G; j0 <= j_hi; j0 += kWarps * G) {
    const int32_t j = j0 + grp;
    const bool valid = j <= j_hi;
    float kr[8] = {}, vr[8] = {};
    if (valid) {
      const KeyAt at = key_at(p, b, sq.k0, j);
      if (at.b >= 0) {
        load_row8(kr, k + at.b * p.sk.b + at.s * p.sk.s);
        load_row8(vr, v + at.b * p.sv.b + at.s * p.sv.s);
      } else {
        bad = true;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float s = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) s += q[r][e] * kr[e];
      s = tile::warp_reduce<L>(s, tile::Sum{});
      if (!valid || j < lo[r] || j > hi[r]) continue;
      if (p.softcap > 0.f) s = p.softcap * tanhf(s * p.scale / p.softcap);
      const float x = Alibi ? fmaf(-al[r], fabsf(float(dg[r] - j)), s * mul) : s * mul;
      if (x > m[r]) {  // a new max (rare once a few keys are in): rescale what is summed so far
        const float corr = tile::rescale<tile::Base::two>(m[r], x);
        l[r] *= corr;
#pragma unroll
        for (int d = 0; d < 8; ++d) acc[r][d] *= corr;
        m[r] = x;
      }
      const float e = tile::ex2_approx(x - m[r]);
      l[r] += e;
#pragma unroll
      for (int d = 0; d < 8; ++d) acc[r][d] = fmaf(e, vr[d], acc[r][d]);
    }
  }
  merge_groups<D, R, G>(s_o, s_ml, acc, m, l, bad, warp * G + grp, sub, rows, p, sp, sq.len_q, b, hk);
}

// One query row per CTA: the chunks' partials merged, out and lse written.
template <class T, int D>
__global__ void __launch_bounds__(D) decode_combine_kernel(Params p, Split sp) {
  const int64_t h = blockIdx.y, i = blockIdx.z % p.seq_q, b = blockIdx.z / p.seq_q;
  const Seq sq = seq_of(p, b);
  if (i >= sq.len_q) return;
  const int64_t row = (b * p.heads_q + h) * p.seq_q + i;
  const float* ml = sp.ml + 2 * row * sp.splits;
  float mx = -INFINITY;
  for (int s = 0; s < sp.splits; ++s) mx = fmaxf(mx, ml[2 * s]);
  float o = 0.f, sum = 0.f;
  for (int s = 0; s < sp.splits; ++s) {
    const float w = tile::merge_weight<tile::Base::two>(ml[2 * s], mx);
    o += w * sp.o[(row * sp.splits + s) * D + threadIdx.x], sum += w * ml[2 * s + 1];
  }
  T* out = static_cast<T*>(p.out) + b * p.so.b + (sq.q0 + i) * p.so.s + h * p.so.h;
  // sum is 0 where the row saw no key; a NaN (a bad cache entry, or NaN inputs) stays NaN.
  out[threadIdx.x * p.so.d] = tile::from_float<T>(sum == 0.f ? 0.f : o / sum);
  if (p.lse && threadIdx.x == 0)
    p.lse[b * p.lse_b + h * p.lse_h + sq.q0 + i] = sum == 0.f ? INFINITY : (mx + log2f(sum)) * kLn2;
}

// Query rows a CTA takes: the smallest power of two covering the rows that share a KV head (the
// GQA group x seq_q), at most 8.
int pack_of(const Params& p) {
  const int64_t n = p.group * p.seq_q;
  return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
}
// CTAs per split: batch x KV heads x row blocks.
int64_t ctas_per_split(const Params& p) {
  return p.batch * (p.heads_q / p.group) * runtime::ceil_div(p.group * p.seq_q, int64_t(pack_of(p)));
}

template <class T, int D, int R, bool Alibi>
void launch_typed(const Params& p, int splits, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads_q * p.seq_q;
  Split sp;
  sp.splits = splits;
  sp.chunk = int((p.seq_k + splits - 1) / splits);
  sp.row_blocks = runtime::ceil_div(p.group * p.seq_q, int64_t(R));
  runtime::Scratch o(size_t(rows) * splits * D * sizeof(float), stream), ml(size_t(rows) * splits * 2 * sizeof(float), stream);
  sp.o = o.as<float>(), sp.ml = ml.as<float>();
  const dim3 grid(unsigned(splits), unsigned(p.heads_q / p.group * sp.row_blocks), unsigned(p.batch));
  decode_split_kernel<T, D, R, Alibi><<<grid, kWarps * 32, 0, stream>>>(p, sp);
  TESSERA_LAUNCH_CHECK();
  decode_combine_kernel<T, D><<<dim3(1, unsigned(p.heads_q), unsigned(p.batch * p.seq_q)), D, 0, stream>>>(p, sp);
  TESSERA_LAUNCH_CHECK();
}

// Calls f(Type<T>, D, R, Alibi) with the split kernel's parameters for p (integral constants).
template <class T>
struct Type {
  using type = T;
};
template <class F>
void with_split_kernel(const Params& p, F&& f) {
  with_head_dim(p.dim, [&](auto d) {
    const auto rows = [&](auto t) {
      const auto alibi = [&](auto r) {
        if (p.alibi) f(t, d, r, std::true_type{});
        else f(t, d, r, std::false_type{});
      };
      switch (pack_of(p)) {
        case 1: return alibi(std::integral_constant<int, 1>{});
        case 2: return alibi(std::integral_constant<int, 2>{});
        case 4: return alibi(std::integral_constant<int, 4>{});
        default: return alibi(std::integral_constant<int, 8>{});
      }
    };
    if (p.dtype == DType::float16) rows(Type<__half>{});
    else rows(Type<__nv_bfloat16>{});
  });
}

void launch(const Params& p, int splits, cudaStream_t stream) {
  with_split_kernel(p, [&](auto t, auto d, auto r, auto a) {
    launch_typed<typename decltype(t)::type, d, r, a>(p, splits, stream);
  });
}

constexpr int kMaxSplits = 1024;

// The split kernel p runs (its registers set how many CTAs fit on an SM).
const void* split_kernel_of(const Params& p) {
  const void* fn = nullptr;
  with_split_kernel(p, [&](auto t, auto d, auto r, auto a) {
    fn = reinterpret_cast<const void*>(decode_split_kernel<typename decltype(t)::type, d, r, a>);
  });
  return fn;
}

// The default split: one full wave of the CTAs that fit on the GPU at once (a memory-bound kernel
// gains nothing from a second wave but its tail), no chunk shorter than 256 keys.
int default_splits(const Params& p) {
  const int64_t units = ctas_per_split(p);
  const int64_t resident = runtime::resident_ctas(split_kernel_of(p), kWarps * 32);
  const int64_t want = std::max<int64_t>(1, resident / units);
  return int(std::clamp<int64_t>(std::min(want, (p.seq_k + 255) / 256), 1, kMaxSplits));
}

// The tuned split count (runtime/tuner.hpp): keyed by arch, dtype, head dimension, the CTAs per
// split and the keys (each rounded up to a power of two), the rows a CTA takes and whether a block
// table is read; candidates the
// default, then a quarter to four times it and a single chunk, none shorter than 64 keys.
int tuned_splits(const Params& p, cudaStream_t stream) {
  const int base = default_splits(p);
  const bool tune = runtime::autotune_enabled();
  if (!tune && !runtime::has_tuned(p.device, "attention")) return base;
  const std::string key = "sm" + std::to_string(runtime::device_props(p.device).major) + "0|decode|" +
                          dtype_name(p.dtype) + "|d" + std::to_string(p.dim) + "|ctas" +
                          std::to_string(runtime::shape_bucket(ctas_per_split(p))) + "|rows" +
                          std::to_string(pack_of(p)) + "|k" + std::to_string(runtime::shape_bucket(p.seq_k)) +
                          (p.table ? "|paged" : "");
  std::vector<std::string> names;
  if (tune) {
    const int most = int(std::clamp<int64_t>((p.seq_k + 63) / 64, 1, kMaxSplits));
    std::vector<int> counts = {base};
    for (int c : {base / 4, base / 2, base * 2, base * 4, 1})
      if (c >= 1 && c <= most && std::find(counts.begin(), counts.end(), c) == counts.end()) counts.push_back(c);
    for (int c : counts) names.push_back("splits=" + std::to_string(c));
  }
  const auto parse = [](const std::string& name) {
    return name.rfind("splits=", 0) == 0 ? std::clamp(std::atoi(name.c_str() + 7), 1, kMaxSplits) : 0;
  };
  const auto run = [&](const std::string& name) { launch(p, parse(name), stream); };
  const auto found = runtime::tuned_config(p.device, "attention", key, tune, names, run, stream);
  const int c = found ? parse(*found) : 0;
  return c > 0 ? c : base;
}

}  // namespace decode

bool DecodeTier::can_implement(const Params& p, const TierCtx& c) {
  if (!c.allows(AttentionTier::decode)) return false;
  if (p.dtype != DType::bfloat16 && p.dtype != DType::float16) return false;
  if (p.dim != p.dim_v || (p.dim != 64 && p.dim != 128 && p.dim != 256)) return false;
  if (p.seq_q > decode::kMaxQueries || p.heads_q > 65535 || p.batch * p.seq_q > 65535 || p.seq_k > INT32_MAX / 2)
    return false;
  if (p.heads_q / p.group * runtime::ceil_div(p.group * p.seq_q, int64_t(decode::pack_of(p))) > 65535) return false;
  // 16-byte rows of q, k and v: the head dimension contiguous, other strides and data aligned.
  const auto rows_ok = [](const void* ptr, const Strides& s) {
    return s.d == 1 && reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && s.b % 8 == 0 && s.s % 8 == 0 && s.h % 8 == 0;
  };
  return rows_ok(p.q, p.sq) && rows_ok(p.k, p.sk) && rows_ok(p.v, p.sv);
}

// The split is the tuned one where the cache has it (or tuning on first use measures it here, on
// c.stream), else the default.
DecodeTier::Plan DecodeTier::plan(const Params& p, const TierCtx& c) {
  return {decode::tuned_splits(p, c.stream), decode::pack_of(p)};
}

std::string DecodeTier::Plan::describe() const {
  return std::to_string(splits) + " splits of the keys, " + std::to_string(rows) + " query rows a CTA, CTAs of " +
         std::to_string(decode::kWarps * 32) + " threads, then a merge kernel";
}

void DecodeTier::launch(const Params& p, const Plan& plan, cudaStream_t stream) { decode::launch(p, plan.splits, stream); }

}  // namespace tessera::attn
