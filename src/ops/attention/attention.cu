// attention: out = softmax(scale * Q K^T, masked) V (tessera/ops/attention.hpp).
//
// The generic tier: one warp per query row, each lane holding head_dim / 32 of the row's query
// and output, keys visited in order with the online softmax (running max and sum in float32).
// Any strides, any head dimension up to 256, every mask and ALiBi; what the tensor-core tier
// (attention_sm90.cu) is checked against on the GPU, and what runs where it does not apply.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "ops/attention/attention.cuh"
#include "tessera/ops/attention.hpp"
#include "tile/convert.cuh"
#include "tile/reduce.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

using attn::Params;
using attn::Strides;

constexpr const char* kOp = "attention";
constexpr int kWarps = 4;     // query rows per CTA
constexpr int kMaxDim = attn::kMaxHeadDim;  // a lane's registers hold 8 values of a row

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attention_rows_kernel(Params p) {
  using tile::to_float;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.batch * p.heads_q * p.seq_q) return;
  const int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads_q, b = row / p.seq_q / p.heads_q;
  const attn::Seq sq = attn::seq_of(p, b);
  if (i >= sq.len_q) return;
  const int64_t hk = h / p.group;
  const T* q = static_cast<const T*>(p.q) + b * p.sq.b + (sq.q0 + i) * p.sq.s + h * p.sq.h;
  const T* k = static_cast<const T*>(p.k) + hk * p.sk.h;
  const T* v = static_cast<const T*>(p.v) + hk * p.sv.h;

  float qr[kMaxDim / 32], acc[kMaxDim / 32];
#pragma unroll
  for (int c = 0; c < kMaxDim / 32; ++c) {
    const int64_t d = lane + 32 * c;
    qr[c] = d < p.dim ? to_float(q[d * p.sq.d]) * p.scale : 0.f;
    acc[c] = 0.f;
  }
  const attn::KeyRange r = attn::key_range(i, sq.len_q, sq.len_k, p.causal, p.window_left, p.window_right);
  const int64_t lo = r.lo, hi = r.hi;
  const float slope = attn::alibi_slope(p, b, h);  // 0: no ALiBi, a bias of 0

  float m = -INFINITY, l = 0.f;
  bool bad = sq.bad;  // a KV cache's length or block id out of range: the row becomes NaN
  for (int64_t j = lo; j <= hi; ++j) {
    const attn::KeyAt at = attn::key_at(p, b, sq.k0, j);
    if (at.b < 0) {
      bad = true;
      continue;
    }
    const T* kj = k + at.b * p.sk.b + at.s * p.sk.s;
    float s = 0.f;
#pragma unroll
    for (int c = 0; c < kMaxDim / 32; ++c) {
      const int64_t d = lane + 32 * c;
      if (d < p.dim) s += qr[c] * to_float(kj[d * p.sk.d]);
    }
    s = tile::warp_sum(s);
    if (p.softcap > 0.f) s = p.softcap * tanhf(s / p.softcap);
    s += attn::alibi_bias(slope, i, j, sq.len_q, sq.len_k);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), e = expf(s - m_new);
    l = l * corr + e;
    const T* vj = v + at.b * p.sv.b + at.s * p.sv.s;
#pragma unroll
    for (int c = 0; c < kMaxDim / 32; ++c) {
      const int64_t d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < p.dim_v ? e * to_float(vj[d * p.sv.d]) : 0.f);
    }
    m = m_new;
  }
  T* o = static_cast<T*>(p.out) + b * p.so.b + (sq.q0 + i) * p.so.s + h * p.so.h;
  if (bad) l = NAN;
  const float inv = l == 0.f ? 0.f : 1.f / l;  // l is 0 where no key was seen; NaN stays NaN
#pragma unroll
  for (int c = 0; c < kMaxDim / 32; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < p.dim_v) o[d * p.so.d] = tile::from_float<T>(acc[c] * inv);
  }
  if (p.lse && lane == 0) p.lse[b * p.lse_b + h * p.lse_h + sq.q0 + i] = l == 0.f ? INFINITY : m + logf(l);
}

}  // namespace

namespace attn {

void check_arguments(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView* lse, const AttentionOptions& o, bool paged) {
  const char* names[4] = {"q", paged ? "k_cache" : "k", paged ? "v_cache" : "v", "out"};
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{names[0], &q}, {names[1], &k}, {names[2], &v},
                               {names[3], &out}}) {
    detail::check_cuda_tensor(op, arg, *t);
    if (t->ndim != 4)
      detail::throw_arg(ErrorKind::value, op, arg, "a 4-d tensor [batch, seq, heads, head_dim]",
                        std::to_string(t->ndim) + "-d");
  }
  detail::check_dtype_in(op, "q", q, {DType::float32, DType::float16, DType::bfloat16});
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{names[1], &k}, {names[2], &v}, {names[3], &out}}) {
    detail::check_same_dtype(op, arg, *t, "q", q);
    detail::check_same_device(op, arg, *t, "q", q);
  }
  const auto dims = [](const TensorView& t) {
    return "[" + std::to_string(t.shape[0]) + ", " + std::to_string(t.shape[1]) + ", " + std::to_string(t.shape[2]) +
           ", " + std::to_string(t.shape[3]) + "]";
  };
  const char* k_arg = paged ? "k_cache" : "k";
  const char* v_arg = paged ? "v_cache" : "v";
  if ((!paged && k.shape[0] != q.shape[0]) || k.shape[3] != q.shape[3] || k.shape[2] == 0 ||
      q.shape[2] % k.shape[2] != 0)
    detail::throw_arg(ErrorKind::value, op, k_arg,
                      (paged ? std::string("[num_blocks, block_size, heads_kv, head_dim] with")
                             : "[batch, seq_k, heads_kv, head_dim] with q's batch " + std::to_string(q.shape[0]) +
                                   " and") +
                          " head_dim " + std::to_string(q.shape[3]) + ", heads_kv dividing q's " +
                          std::to_string(q.shape[2]),
                      dims(k));
  if (v.shape[0] != k.shape[0] || v.shape[1] != k.shape[1] || v.shape[2] != k.shape[2])
    detail::throw_arg(ErrorKind::value, op, v_arg,
                      std::string(k_arg) + "'s first three dimensions " + dims(k), dims(v));
  if (out.shape[0] != q.shape[0] || out.shape[1] != q.shape[1] || out.shape[2] != q.shape[2] ||
      out.shape[3] != v.shape[3])
    detail::throw_arg(ErrorKind::value, op, "out", "[batch, seq_q, heads_q, head_dim_v] = [" +
                      std::to_string(q.shape[0]) + ", " + std::to_string(q.shape[1]) + ", " +
                      std::to_string(q.shape[2]) + ", " + std::to_string(v.shape[3]) + "]", dims(out));
  if (q.shape[3] > kMaxHeadDim || v.shape[3] > kMaxHeadDim)
    detail::throw_arg(ErrorKind::value, op, q.shape[3] > kMaxHeadDim ? "q" : v_arg,
                      "a head dimension of at most " + std::to_string(kMaxHeadDim), dims(q.shape[3] > kMaxHeadDim ? q : v));
  detail::check_no_internal_overlap(op, "out", out);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {k_arg, &k}, {v_arg, &v}})
    detail::check_no_overlap(op, "out", out, arg, *t, false);
  if (lse) {
    detail::check_cuda_tensor(op, "lse", *lse);
    detail::check_dtype_in(op, "lse", *lse, {DType::float32});
    detail::check_same_device(op, "lse", *lse, "q", q);
    const bool shape = lse->ndim == 3 && lse->shape[0] == q.shape[0] && lse->shape[1] == q.shape[2] &&
                       lse->shape[2] == q.shape[1];
    if (!shape || !lse->is_contiguous())
      detail::throw_arg(ErrorKind::value, op, "lse", "a contiguous [batch, heads_q, seq_q] tensor",
                        std::to_string(lse->ndim) + "-d" + (shape ? ", not contiguous" : ""));
  }
  if (!(o.scale >= 0) || !std::isfinite(o.scale))
    detail::throw_arg(ErrorKind::value, op, "scale", "a finite number >= 0 (0: 1 / sqrt(head_dim))",
                      std::to_string(o.scale));
  if (!(o.softcap >= 0) || !std::isfinite(o.softcap))
    detail::throw_arg(ErrorKind::value, op, "softcap", "a finite number >= 0 (0: none)", std::to_string(o.softcap));
}

void check_alibi(const char* op, const AttentionOptions& o, const TensorView& q, int64_t batch, int64_t heads_q) {
  if (!o.alibi_slopes) return;
  const TensorView& t = *o.alibi_slopes;
  constexpr const char* arg = "alibi_slopes";
  detail::check_cuda_tensor(op, arg, t);
  detail::check_dtype_in(op, arg, t, {DType::float32});
  detail::check_same_device(op, arg, t, "q", q);
  const bool shape = (t.ndim == 1 && t.shape[0] == heads_q) ||
                     (t.ndim == 2 && t.shape[0] == batch && t.shape[1] == heads_q);
  if (!shape)
    detail::throw_arg(ErrorKind::value, op, arg,
                      "a float32 tensor [heads_q] = [" + std::to_string(heads_q) + "] or [batch, heads_q] = [" +
                          std::to_string(batch) + ", " + std::to_string(heads_q) + "]",
                      detail::dims(t));
}

}  // namespace attn

namespace {

// The generic tier: any dtype, strides, head dimension and mask; what runs where the others do not.
struct GenericTier {
  static constexpr const char* kName = "generic";
  static constexpr const char* kWhen = "any dtype, strides and head_dim <= 256: a warp per query row";
  struct Plan {
    unsigned grid = 0;
    std::string describe() const {
      return std::to_string(grid) + " CTAs of " + std::to_string(kWarps) + " warps, a warp per query row";
    }
  };
  static bool can_implement(const Params&, const attn::TierCtx& c) { return c.allows(AttentionTier::generic); }
  static Plan plan(const Params& p, const attn::TierCtx&) {
    return {static_cast<unsigned>(runtime::ceil_div(p.batch * p.heads_q * p.seq_q, int64_t(kWarps)))};
  }
  static void launch(const Params& p, const Plan& plan, cudaStream_t stream) {
    if (plan.grid == 0) return;
    switch (p.dtype) {
      case DType::float32: attention_rows_kernel<float><<<plan.grid, kWarps * 32, 0, stream>>>(p); break;
      case DType::float16: attention_rows_kernel<__half><<<plan.grid, kWarps * 32, 0, stream>>>(p); break;
      default: attention_rows_kernel<__nv_bfloat16><<<plan.grid, kWarps * 32, 0, stream>>>(p); break;
    }
    TESSERA_LAUNCH_CHECK();
  }
};

// Runs the first tier that takes `p` (its windows resolved), of those `tier` allows; a tier named
// that cannot take the call is an error.
void launch(const char* op, Params p, AttentionTier tier, cudaStream_t stream) {
  attn::resolve_windows(p);
  const attn::TierCtx ctx{tier, stream};
  if (tier == AttentionTier::decode && !attn::DecodeTier::can_implement(p, ctx))
    detail::throw_arg(ErrorKind::value, op, "tier",
                      "a call the decode tier takes (seq_q <= 16, bfloat16/float16, head_dim = head_dim_v in {64, "
                      "128, 256}, 16-byte aligned rows)", "one it does not");
  if (tier == AttentionTier::sm90 && !attn::Sm90Tier::can_implement(p, ctx))
    detail::throw_arg(ErrorKind::value, op, "tier",
                      "a call the sm90 tier takes (Hopper, bfloat16/float16, head_dim = head_dim_v in {64, 128, "
                      "256}, the head dimension contiguous, 16-byte aligned strides and data)",
                      "one it does not");
  runtime::run_first<attn::DecodeTier, attn::Sm90Tier, GenericTier>(op, p, ctx, stream);
}

}  // namespace

namespace attn {

Params params_of(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                 const AttentionOptions& options) {
  Params p{};
  p.dtype = q.dtype, p.device = q.device.index;
  p.q = q.data, p.k = k.data, p.v = v.data, p.out = out.data;
  p.sq = strides_of(q), p.sk = strides_of(k), p.sv = strides_of(v), p.so = strides_of(out);
  p.batch = q.shape[0], p.seq_q = q.shape[1], p.seq_k = k.shape[1], p.heads_q = q.shape[2];
  p.group = q.shape[2] / k.shape[2], p.dim = q.shape[3], p.dim_v = v.shape[3];
  p.scale = static_cast<float>(options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3])));
  p.softcap = static_cast<float>(options.softcap);
  p.causal = options.causal, p.window_left = options.window_left, p.window_right = options.window_right;
  p.deterministic = options.deterministic;
  p.lse_b = p.heads_q * p.seq_q, p.lse_h = p.seq_q;
  if (const TensorView* a = options.alibi_slopes) {  // checked by check_alibi: [heads_q] or [batch, heads_q]
    p.alibi = static_cast<const float*>(a->data);
    p.alibi_b = a->ndim == 2 ? a->strides[0] : 0, p.alibi_h = a->strides[a->ndim - 1];
  }
  return p;
}

TensorView as_batch_of_one(const TensorView& t) {
  TensorView b = t;
  b.ndim = t.ndim + 1;
  for (int d = t.ndim; d > 0; --d) b.shape[d] = t.shape[d - 1], b.strides[d] = t.strides[d - 1];
  b.shape[0] = 1, b.strides[0] = 0;
  return b;
}

void check_packed(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                  const TensorView& out, const TensorView* lse) {
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}})
    if (t->ndim != 3)
      detail::throw_arg(ErrorKind::value, op, arg, "a 3-d tensor [total, heads, head_dim] (packed sequences)",
                        std::to_string(t->ndim) + "-d");
  if (lse && (lse->ndim != 2 || lse->shape[0] != q.shape[1] || lse->shape[1] != q.shape[0]))
    detail::throw_arg(ErrorKind::value, op, "lse", "a [heads_q, total_q] tensor",
                      std::to_string(lse->ndim) + "-d");
}

Varlen check_varlen(const char* op, const TensorView& q, const TensorView& k, const TensorView& cu_seqlens_q,
                    const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k, cudaStream_t stream) {
  Varlen r;
  const std::pair<const char*, const TensorView*> cus[2] = {{"cu_seqlens_q", &cu_seqlens_q}, {"cu_seqlens_k", &cu_seqlens_k}};
  std::vector<int32_t> host[2];
  for (int s = 0; s < 2; ++s) {
    const auto& [arg, t] = cus[s];
    detail::check_cuda_tensor(op, arg, *t);
    detail::check_dtype_in(op, arg, *t, {DType::int32});
    detail::check_same_device(op, arg, *t, "q", q);
    if (t->ndim != 1 || t->shape[0] < 2 || !t->is_contiguous() || t->shape[0] != cu_seqlens_q.shape[0])
      detail::throw_arg(ErrorKind::value, op, arg, "a contiguous 1-d tensor of batch + 1 >= 2 offsets, as long as "
                        "cu_seqlens_q", std::to_string(t->ndim) + "-d of " + std::to_string(t->shape[0]));
    host[s].resize(size_t(t->shape[0]));
    TESSERA_CUDA_CHECK(cudaMemcpyAsync(host[s].data(), t->data, host[s].size() * 4, cudaMemcpyDeviceToHost, stream));
  }
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t total[2] = {q.shape[0], k.shape[0]}, maxima[2] = {max_seqlen_q, max_seqlen_k};
  const char* max_arg[2] = {"max_seqlen_q", "max_seqlen_k"};
  for (int s = 0; s < 2; ++s) {
    const auto& h = host[s];
    if (h[0] != 0 || h.back() != total[s])
      detail::throw_arg(ErrorKind::value, op, cus[s].first, "offsets from 0 to the packed length " + std::to_string(total[s]),
                        "[" + std::to_string(h[0]) + ", ..., " + std::to_string(h.back()) + "]");
    for (size_t b = 1; b < h.size(); ++b) {
      if (h[b] < h[b - 1])
        detail::throw_arg(ErrorKind::value, op, cus[s].first, "non-decreasing offsets",
                          "offset " + std::to_string(b) + " = " + std::to_string(h[b]) + " < " + std::to_string(h[b - 1]));
      if (h[b] - h[b - 1] > maxima[s])
        detail::throw_arg(ErrorKind::value, op, max_arg[s], "at least every sequence's length",
                          std::to_string(maxima[s]) + ", with sequence " + std::to_string(b - 1) + " of " +
                              std::to_string(h[b] - h[b - 1]));
    }
  }
  r.batch = int64_t(host[0].size()) - 1;
  return r;
}

void use_varlen(Params& p, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k, int64_t batch,
                int64_t max_seqlen_q, int64_t max_seqlen_k, int64_t total_q, int64_t total_k) {
  p.cu_q = static_cast<const int32_t*>(cu_seqlens_q.data), p.cu_k = static_cast<const int32_t*>(cu_seqlens_k.data);
  p.batch = batch, p.seq_q = max_seqlen_q, p.seq_k = max_seqlen_k;
  p.lse_b = 0, p.lse_h = total_q, p.total_q = total_q, p.total_k = total_k;
}

}  // namespace attn

void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const TensorView* lse, const AttentionOptions& options, cudaStream_t stream) {
  attn::check_arguments(kOp, q, k, v, out, lse, options);
  attn::check_alibi(kOp, options, q, q.shape[0], q.shape[2]);
  if (out.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  Params p = attn::params_of(q, k, v, out, options);
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  launch(kOp, p, options.tier, stream);
}

void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k, const AttentionOptions& options,
                      cudaStream_t stream) {
  constexpr const char* op = "attention_varlen";
  attn::check_packed(op, q, k, v, out, lse);
  const TensorView q4 = attn::as_batch_of_one(q), k4 = attn::as_batch_of_one(k), v4 = attn::as_batch_of_one(v),
                   o4 = attn::as_batch_of_one(out), l3 = lse ? attn::as_batch_of_one(*lse) : TensorView{};
  attn::check_arguments(op, q4, k4, v4, o4, lse ? &l3 : nullptr, options);
  const attn::Varlen vl = attn::check_varlen(op, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, stream);
  attn::check_alibi(op, options, q, vl.batch, q.shape[1]);
  if (out.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  Params p = attn::params_of(q4, k4, v4, o4, options);
  attn::use_varlen(p, cu_seqlens_q, cu_seqlens_k, vl.batch, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0]);
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  launch(op, p, options.tier, stream);
}

void attention_kvcache(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                       const TensorView& out, const TensorView* lse, const TensorView& cache_seqlens,
                       const TensorView* block_table, const AttentionOptions& options, cudaStream_t stream) {
  constexpr const char* op = "attention_kvcache";
  attn::check_arguments(op, q, k_cache, v_cache, out, lse, options, block_table != nullptr);
  const int64_t batch = q.shape[0];
  attn::check_alibi(op, options, q, batch, q.shape[2]);
  detail::check_cuda_tensor(op, "cache_seqlens", cache_seqlens);
  detail::check_dtype_in(op, "cache_seqlens", cache_seqlens, {DType::int32});
  detail::check_same_device(op, "cache_seqlens", cache_seqlens, "q", q);
  if (cache_seqlens.ndim != 1 || cache_seqlens.shape[0] != batch || !cache_seqlens.is_contiguous())
    detail::throw_arg(ErrorKind::value, op, "cache_seqlens",
                      "a contiguous 1-d tensor of q's batch " + std::to_string(batch) + " lengths",
                      std::to_string(cache_seqlens.ndim) + "-d of " +
                          (cache_seqlens.ndim ? std::to_string(cache_seqlens.shape[0]) : std::string("1")));
  int64_t capacity = k_cache.shape[1];  // keys a sequence can hold
  if (block_table) {
    const TensorView& t = *block_table;
    detail::check_cuda_tensor(op, "block_table", t);
    detail::check_dtype_in(op, "block_table", t, {DType::int32});
    detail::check_same_device(op, "block_table", t, "q", q);
    if (t.ndim != 2 || t.shape[0] != batch || t.shape[1] < 1 || t.strides[1] != 1)
      detail::throw_arg(ErrorKind::value, op, "block_table",
                        "a [batch = " + std::to_string(batch) + ", max_blocks >= 1] tensor with contiguous rows",
                        std::to_string(t.ndim) + "-d" + (t.ndim == 2 ? " [" + std::to_string(t.shape[0]) + ", " +
                                                              std::to_string(t.shape[1]) + "]" : std::string()));
    if (k_cache.shape[1] < 1)
      detail::throw_arg(ErrorKind::value, op, "k_cache", "blocks of at least one row", "block_size 0");
    capacity = t.shape[1] * k_cache.shape[1];
  }
  if (capacity > INT32_MAX)
    detail::throw_arg(ErrorKind::value, op, block_table ? "block_table" : "k_cache",
                      "a cache of at most 2^31 - 1 keys a sequence", std::to_string(capacity));
  if (out.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  Params p = attn::params_of(q, k_cache, v_cache, out, options);
  p.seq_k = capacity;
  p.len_k = static_cast<const int32_t*>(cache_seqlens.data);
  if (block_table) {
    p.table = static_cast<const int32_t*>(block_table->data);
    p.table_stride = block_table->strides[0], p.block_size = k_cache.shape[1], p.num_blocks = k_cache.shape[0];
  }
  p.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  launch(op, p, options.tier, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// Outputs and lse shaped from q, k and v: torch kernels written by hand
// (python/src/torch/attention.cpp).
const OpRegistrar kAttention = describe("attention", "attention", "softmax(scale * Q K^T, masked) V in FlashAttention's layout: GQA, causal, window, soft-cap, ALiBi")
    .schema("attention(Tensor q, Tensor k, Tensor v, *, bool causal=False, float? scale=None, "
            "int window_left=-1, int window_right=-1, float softcap=0.0, bool deterministic=False, "
            "Tensor? alibi_slopes=None) -> (Tensor, Tensor)")
    .schema("attention.varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "int max_seqlen_q, int max_seqlen_k, *, bool causal=False, float? scale=None, "
            "int window_left=-1, int window_right=-1, float softcap=0.0, bool deterministic=False, "
            "Tensor? alibi_slopes=None) -> (Tensor, Tensor)")
    .schema("attention.kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_seqlens, "
            "Tensor? block_table=None, *, bool causal=False, float? scale=None, int window_left=-1, "
            "int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None) -> (Tensor, Tensor)")
    .dtypes({DType::float32, DType::float16, DType::bfloat16});
const OpRegistrar kAttentionBackward = describe("attention_backward", "attention", "dq, dk, dv of attention from the forward's out and lse")
    .schema("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, *, "
            "bool causal=False, float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.0, "
            "bool deterministic=False, Tensor? alibi_slopes=None) -> (Tensor, Tensor, Tensor)")
    .schema("attention_backward.varlen(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor cu_seqlens_q, Tensor cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, *, bool causal=False, "
            "float? scale=None, int window_left=-1, int window_right=-1, float softcap=0.0, "
            "bool deterministic=False, Tensor? alibi_slopes=None) -> (Tensor, Tensor, Tensor)");
}  // namespace
}  // namespace tessera
