// What the attention tiers share: the arguments as the launcher resolved them, and the tiers
// (runtime/tier.hpp), each answering can_implement, plan and launch. attention.cu and
// attention_backward.cu check the arguments and run the first tier of their table that takes them.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tessera/ops/attention.hpp"
#include "tessera/tensor.hpp"

namespace tessera::attn {

constexpr int kMaxHeadDim = 256;  // what the generic kernels hold in registers

struct Strides {
  int64_t b, s, h, d;  // elements
};
inline Strides strides_of(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}; }

// The forward's argument checks (attention.cu), naming `op` in errors; lse may be null.
// paged: k and v are [num_blocks, block_size, heads_kv, dim] cache blocks, their batch free.
void check_arguments(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView* lse, const AttentionOptions& o, bool paged = false);

struct Params {
  DType dtype;
  int device;
  const void *q, *k, *v;
  void* out;
  float* lse;  // nullable; [batch, heads_q, seq_q] contiguous
  Strides sq, sk, sv, so;
  int64_t batch, seq_q, seq_k, heads_q, group, dim, dim_v;
  float scale, softcap;  // softcap 0: none
  bool causal;
  int64_t window_left, window_right;  // -1: unbounded (resolve_windows: also at or beyond seq_k)
  // ALiBi: the slope of sequence b, query head h is alibi[b * alibi_b + h * alibi_h]; null: none.
  const float* alibi = nullptr;
  int64_t alibi_b = 0, alibi_h = 0;
  bool deterministic;                 // the backward's dq summed in a fixed order
  // lse (and the backward's delta) of query i of sequence b, head h: b * lse_b + h * lse_h + q0 + i.
  int64_t lse_b, lse_h;
  // Packed sequences (varlen): batch + 1 offsets into the rows of q and k (the tensors [total,
  // heads, dim], their batch stride 0); seq_q and seq_k are then the longest lengths.
  const int32_t* cu_q = nullptr;
  const int32_t* cu_k = nullptr;
  int64_t total_q = 0, total_k = 0;  // varlen: the packed lengths
  // A KV cache (attention_kvcache): sequence b sees its first len_k[b] keys of seq_k; with a block
  // table, key j of sequence b is row j % block_size of cache block table[b * table_stride + j /
  // block_size] (k and v [num_blocks, block_size, heads_kv, dim], whose batch stride is a block's).
  const int32_t* len_k = nullptr;
  const int32_t* table = nullptr;
  int64_t table_stride = 0, block_size = 0, num_blocks = 0;
};

// Sequence b: its first query and key rows, and its lengths. `bad`: a KV cache length outside
// [0, seq_k] (taken as seq_k), which the kernels turn into NaN.
struct Seq {
  int64_t q0, k0, len_q, len_k;
  bool bad = false;
};
__device__ inline Seq seq_of(const Params& p, int64_t b) {
  if (p.len_k) {
    const int64_t n = p.len_k[b];
    const bool bad = n < 0 || n > p.seq_k;
    return {0, 0, p.seq_q, bad ? p.seq_k : n, bad};
  }
  if (!p.cu_q) return {0, 0, p.seq_q, p.seq_k};
  const int64_t q0 = p.cu_q[b], k0 = p.cu_k[b];
  return {q0, k0, p.cu_q[b + 1] - q0, p.cu_k[b + 1] - k0};
}

// Where key j of sequence b (whose keys start at row k0) lies: k's batch (a cache block, under a
// block table) and row; batch -1 where the block table names a block outside the cache.
struct KeyAt {
  int64_t b, s;
};
__device__ inline KeyAt key_at(const Params& p, int64_t b, int64_t k0, int64_t j) {
  if (!p.table) return {b, k0 + j};
  // 32-bit division: the host keeps a cache's capacity below 2^31 keys.
  const int32_t jj = int32_t(j), bs = int32_t(p.block_size);
  const int64_t blk = p.table[b * p.table_stride + jj / bs];
  return {blk >= 0 && blk < p.num_blocks ? blk : -1, jj % bs};
}

// The Params of a call (options resolved; lse laid out [batch, heads_q, seq_q]), from 4-d views;
// varlen callers then set cu_q, cu_k, the maxima and lse's layout.
Params params_of(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const AttentionOptions& options);

// FlashAttention's reading of a window side at or beyond the key length (p.seq_k: the longest
// sequence's for packed sequences, the capacity for a KV cache): unbounded there. Its kernels see
// -1 then; the mask alone would bound a right side where seq_q > seq_k (the diagonal then starts
// left of the first key). The launchers call it once seq_k is final.
inline void resolve_windows(Params& p) {
  if (p.window_left >= p.seq_k) p.window_left = -1;
  if (p.window_right >= p.seq_k) p.window_right = -1;
}

// options.alibi_slopes checked (if any): a float32 tensor [heads_q] or [batch, heads_q] on q's
// device. `batch`: the sequences (cu_seqlens' entries - 1 for packed ones).
void check_alibi(const char* op, const AttentionOptions& o, const TensorView& q, int64_t batch, int64_t heads_q);

// ALiBi's bias of query i against key j of a sequence of len_q queries and len_k keys, in the
// units of the scale * q.k (slope as given): -slope |i + len_k - len_q - j|. In float: distances
// are exact below 2^24 keys, and beyond that the bias's rounding is far below the score's.
__host__ __device__ inline float alibi_bias(float slope, int64_t i, int64_t j, int64_t len_q, int64_t len_k) {
  return -slope * fabsf(float(i + len_k - len_q - j));
}
__device__ inline float alibi_slope(const Params& p, int64_t b, int64_t h) {
  return p.alibi ? p.alibi[b * p.alibi_b + h * p.alibi_h] : 0.f;
}

// The keys query row i (of seq_q) sees: [lo, hi], the diagonal shifted by seq_k - seq_q so that
// the last query sees the last key (FlashAttention's bottom-right alignment). Empty when hi < lo.
struct KeyRange {
  int64_t lo, hi;
};
__host__ __device__ inline KeyRange key_range(int64_t i, int64_t seq_q, int64_t seq_k, bool causal,
                                              int64_t window_left, int64_t window_right) {
  const int64_t diag = i + seq_k - seq_q;
  int64_t hi = causal ? diag : seq_k - 1;
  if (window_right >= 0 && diag + window_right < hi) hi = diag + window_right;
  if (hi > seq_k - 1) hi = seq_k - 1;
  int64_t lo = window_left >= 0 ? diag - window_left : 0;
  if (lo < 0) lo = 0;
  return {lo, hi};
}

// The queries that see key j: [lo, hi], key_range inverted (empty when hi < lo or j >= seq_k).
__host__ __device__ inline KeyRange query_range(int64_t j, int64_t seq_q, int64_t seq_k, bool causal,
                                                int64_t window_left, int64_t window_right) {
  const int64_t off = seq_k - seq_q;
  int64_t lo = 0, hi = j < seq_k ? seq_q - 1 : -1;
  if (causal && j - off > lo) lo = j - off;
  if (window_right >= 0 && j - off - window_right > lo) lo = j - off - window_right;
  if (window_left >= 0 && j - off + window_left < hi) hi = j - off + window_left;
  return {lo, hi};
}

// Packed sequences (varlen): a [total, heads, dim] tensor as the 4-d [1, total, heads, dim] the
// kernels take (and lse [heads, total] as [1, heads, total]); the shape checks of packed
// arguments; cu_seqlens checked on the host (a copy and a wait on `stream`): int32 offsets from 0
// to the packed length, non-decreasing, no sequence longer than its max_seqlen.
TensorView as_batch_of_one(const TensorView& t);
void check_packed(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView* lse);
struct Varlen {
  int64_t batch = 0;
};
Varlen check_varlen(const char* op, const TensorView& q, const TensorView& k, const TensorView& cu_seqlens_q,
                    const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, cudaStream_t stream);
void use_varlen(Params& p, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t batch,
                int64_t max_seqlen_q, int64_t max_seqlen_k, int64_t total_q, int64_t total_k);

// Calls f(std::integral_constant<int, D>{}) for head dimension D = `dim`, 64, 128 or 256: the
// head dimensions the tensor-core and decode tiers compile for.
template <class F>
void with_head_dim(int64_t dim, F&& f) {
  if (dim == 64) f(std::integral_constant<int, 64>{});
  else if (dim == 128) f(std::integral_constant<int, 128>{});
  else f(std::integral_constant<int, 256>{});
}

// ---- the tiers (runtime/tier.hpp) ----------------------------------------------------------------
// What a tier's choice depends on besides the arguments: the tier the caller named
// (AttentionOptions::tier; automatic: any), and the stream on which the decode tier's tuner may
// measure its candidates.
struct TierCtx {
  AttentionTier tier;
  cudaStream_t stream;
  bool allows(AttentionTier t) const { return tier == AttentionTier::automatic || tier == t; }
};

// The forward's tiers, tried in this order: decode, sm90, then the generic tier (attention.cu).
// The decode tier (attention_decode.cu): keys split into chunks over the SMs, then merged.
struct DecodeTier {
  static constexpr const char* kName = "decode";
  static constexpr const char* kWhen =
      "seq_q <= 16, bfloat16/float16, head_dim = head_dim_v in {64, 128, 256}, 16-byte aligned rows: "
      "the keys split over the SMs, then merged";
  struct Plan {
    int splits = 1;  // chunks of the keys, one CTA each per row block
    int rows = 1;    // query rows a CTA takes (those that share a KV head)
    std::string describe() const;
  };
  static bool can_implement(const Params& p, const TierCtx& c);
  static Plan plan(const Params& p, const TierCtx& c);
  static void launch(const Params& p, const Plan& plan, cudaStream_t stream);
};

// The Hopper tier (attention_sm90.cu): TMA, wgmma, warp-specialized.
struct Sm90Tier {
  static constexpr const char* kName = "sm90";
  static constexpr const char* kWhen =
      "Hopper, bfloat16/float16, head_dim = head_dim_v in {64, 128, 256}, the head dimension "
      "contiguous, 16-byte aligned strides and data, no KV cache: TMA, wgmma, warp-specialized";
  struct Plan {
    int block_n = 0, stages = 0;  // keys per tile, stages of K and V in the ring
    dim3 grid;
    std::string describe() const;
  };
  static bool can_implement(const Params& p, const TierCtx& c);
  static Plan plan(const Params& p, const TierCtx& c);
  static void launch(const Params& p, const Plan& plan, cudaStream_t stream);
};

// What the backward takes beyond the forward's Params (whose out is the forward's output).
struct BackwardArgs {
  const void* dout;
  Strides sdo;
  const float* lse;  // laid out as Params' lse_b, lse_h say
  void *dq, *dk, *dv;
  Strides sdq, sdk, sdv;
};

// One backward call, as its tiers see it.
struct BackwardCall {
  Params p;
  BackwardArgs a;
};

// The backward's tiers: sm90, then the generic tier (attention_backward.cu).
// The Hopper backward (attention_backward_sm90.cu): q, k, v and grad_out as the forward's sm90
// tier takes them, out, dk and dv with the head dimension contiguous and 16-byte aligned rows. dq
// is summed across CTAs in float32 by the copy engine's reduce-add, in arrival order, so its last
// bits may differ from run to run, unless p.deterministic.
struct Sm90BackwardTier {
  static constexpr const char* kName = "sm90";
  static constexpr const char* kWhen =
      "Hopper, bfloat16/float16, head_dim = head_dim_v in {64, 128}, the head dimension contiguous, "
      "16-byte aligned rows: TMA, wgmma, a CTA per 128 keys, dq summed across CTAs";
  struct Plan {
    dim3 grid;
    bool deterministic = false;
    std::string describe() const;
  };
  static bool can_implement(const BackwardCall& c, const TierCtx& ctx);
  static Plan plan(const BackwardCall& c, const TierCtx& ctx);
  static void launch(const BackwardCall& c, const Plan& plan, cudaStream_t stream);
};

}  // namespace tessera::attn
