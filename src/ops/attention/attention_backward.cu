// attention_backward: dq, dk, dv of attention (tessera/ops/attention.hpp).
//
// With P = exp(S - lse) recomputed from the forward's lse (S with ALiBi's bias, which has no
// gradient), and delta_i = dO_i . O_i:
//   dV_j = sum_i P_ij dO_i,   dS_ij = P_ij (dO_i . V_j - delta_i) (times the soft-cap's
//   derivative 1 - tanh^2), dQ_i = scale sum_j dS_ij K_j, dK_j = scale sum_i dS_ij Q_i.
// The generic tier: a warp per query row for delta and dQ, then a warp per key row (over the
// query heads of its group) for dK and dV; each gradient row is summed by one warp in a fixed
// order, so the results are deterministic, with no atomics. Any strides, head dimensions up to 256;
// what runs where the tensor-core tier (attention_backward_sm90.cu, tried first) does not apply.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "ops/attention/attention.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/attention.hpp"
#include "tile/convert.cuh"
#include "tile/reduce.cuh"

namespace tessera {
namespace {

using attn::Params;
using attn::Strides;

constexpr const char* kOp = "attention_backward";
constexpr int kWarps = 4;
constexpr int kVals = attn::kMaxHeadDim / 32;  // a lane's share of a row

struct Grad {
  const void *dout, *out;
  const float* lse;
  float* delta;  // [batch, heads_q, seq_q] scratch
  void *dq, *dk, *dv;
  Strides sdo, sdq, sdk, sdv;
};

// Loads a row's lane share (elements lane, lane + 32, ...) as float; zeros past `n`.
template <class T>
__device__ __forceinline__ void load_row(float (&r)[kVals], const T* p, int64_t stride, int64_t n, int lane) {
#pragma unroll
  for (int c = 0; c < kVals; ++c) {
    const int64_t d = lane + 32 * c;
    r[c] = d < n ? tile::to_float(p[d * stride]) : 0.f;
  }
}

template <class T>
__device__ __forceinline__ void store_row(T* p, int64_t stride, const float (&r)[kVals], float mul, int64_t n,
                                          int lane) {
#pragma unroll
  for (int c = 0; c < kVals; ++c) {
    const int64_t d = lane + 32 * c;
    if (d < n) p[d * stride] = tile::from_float<T>(r[c] * mul);
  }
}

__device__ __forceinline__ float dot(const float (&a)[kVals], const float (&b)[kVals]) {
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kVals; ++c) s += a[c] * b[c];
  return tile::warp_sum(s);
}

// P_ij and the factor dS_ij = P_ij (dp - delta_i) * factor, from the raw score q_i . k_j and
// ALiBi's bias (0 without).
struct Prob {
  float p, factor;
};
__device__ __forceinline__ Prob prob(float qk, const Params& p, float lse, float bias) {
  float s = qk * p.scale, factor = 1.f;
  if (p.softcap > 0.f) {
    const float t = tanhf(s / p.softcap);
    s = p.softcap * t, factor = 1.f - t * t;
  }
  return {lse == INFINITY ? 0.f : expf(s + bias - lse), factor};
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attention_dq_kernel(Params p, Grad g) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.batch * p.heads_q * p.seq_q) return;
  const int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads_q, b = row / p.seq_q / p.heads_q, hk = h / p.group;
  const attn::Seq sq = attn::seq_of(p, b);
  if (i >= sq.len_q) return;
  const int64_t t = sq.q0 + i, stat = b * p.lse_b + h * p.lse_h + t;
  float q[kVals], dout[kVals], x[kVals], acc[kVals] = {};
  load_row(q, static_cast<const T*>(p.q) + b * p.sq.b + t * p.sq.s + h * p.sq.h, p.sq.d, p.dim, lane);
  load_row(dout, static_cast<const T*>(g.dout) + b * g.sdo.b + t * g.sdo.s + h * g.sdo.h, g.sdo.d, p.dim_v, lane);
  load_row(x, static_cast<const T*>(g.out) + b * p.so.b + t * p.so.s + h * p.so.h, p.so.d, p.dim_v, lane);
  const float delta = dot(dout, x), lse = g.lse[stat];
  if (lane == 0) g.delta[stat] = delta;
  const T* k = static_cast<const T*>(p.k) + b * p.sk.b + sq.k0 * p.sk.s + hk * p.sk.h;
  const T* v = static_cast<const T*>(p.v) + b * p.sv.b + sq.k0 * p.sv.s + hk * p.sv.h;
  const attn::KeyRange r = attn::key_range(i, sq.len_q, sq.len_k, p.causal, p.window_left, p.window_right);
  const float slope = attn::alibi_slope(p, b, h);
  for (int64_t j = r.lo; j <= r.hi; ++j) {
    load_row(x, k + j * p.sk.s, p.sk.d, p.dim, lane);
    const Prob pr = prob(dot(q, x), p, lse, attn::alibi_bias(slope, i, j, sq.len_q, sq.len_k));
    float vj[kVals];
    load_row(vj, v + j * p.sv.s, p.sv.d, p.dim_v, lane);
    const float ds = pr.p * (dot(dout, vj) - delta) * pr.factor;
#pragma unroll
    for (int c = 0; c < kVals; ++c) acc[c] += ds * x[c];
  }
  store_row(static_cast<T*>(g.dq) + b * g.sdq.b + t * g.sdq.s + h * g.sdq.h, g.sdq.d, acc, p.scale, p.dim, lane);
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attention_dkdv_kernel(Params p, Grad g) {
  const int lane = threadIdx.x % 32;
  const int64_t heads_kv = p.heads_q / p.group;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.batch * heads_kv * p.seq_k) return;
  const int64_t j = row % p.seq_k, hk = row / p.seq_k % heads_kv, b = row / p.seq_k / heads_kv;
  const attn::Seq sq = attn::seq_of(p, b);
  if (j >= sq.len_k) return;
  const int64_t t = sq.k0 + j;
  float k[kVals], v[kVals], dk[kVals] = {}, dv[kVals] = {};
  load_row(k, static_cast<const T*>(p.k) + b * p.sk.b + t * p.sk.s + hk * p.sk.h, p.sk.d, p.dim, lane);
  load_row(v, static_cast<const T*>(p.v) + b * p.sv.b + t * p.sv.s + hk * p.sv.h, p.sv.d, p.dim_v, lane);
  const attn::KeyRange qr = attn::query_range(j, sq.len_q, sq.len_k, p.causal, p.window_left, p.window_right);
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const T* q = static_cast<const T*>(p.q) + b * p.sq.b + sq.q0 * p.sq.s + h * p.sq.h;
    const T* dout = static_cast<const T*>(g.dout) + b * g.sdo.b + sq.q0 * g.sdo.s + h * g.sdo.h;
    const int64_t stats = b * p.lse_b + h * p.lse_h + sq.q0;
    const float slope = attn::alibi_slope(p, b, h);
    for (int64_t i = qr.lo; i <= qr.hi; ++i) {
      float qi[kVals], di[kVals];
      load_row(qi, q + i * p.sq.s, p.sq.d, p.dim, lane);
      load_row(di, dout + i * g.sdo.s, g.sdo.d, p.dim_v, lane);
      const Prob pr = prob(dot(qi, k), p, g.lse[stats + i], attn::alibi_bias(slope, i, j, sq.len_q, sq.len_k));
      const float ds = pr.p * (dot(di, v) - g.delta[stats + i]) * pr.factor;
#pragma unroll
      for (int c = 0; c < kVals; ++c) dv[c] += pr.p * di[c], dk[c] += ds * qi[c];
    }
  }
  store_row(static_cast<T*>(g.dk) + b * g.sdk.b + t * g.sdk.s + hk * g.sdk.h, g.sdk.d, dk, p.scale, p.dim, lane);
  store_row(static_cast<T*>(g.dv) + b * g.sdv.b + t * g.sdv.s + hk * g.sdv.h, g.sdv.d, dv, 1.f, p.dim_v, lane);
}

template <class T>
void launch_typed(const Params& p, const Grad& g, cudaStream_t stream) {
  const int64_t q_rows = p.batch * p.heads_q * p.seq_q, k_rows = p.batch * (p.heads_q / p.group) * p.seq_k;
  if (q_rows > 0)
    attention_dq_kernel<T><<<unsigned(runtime::ceil_div(q_rows, kWarps)), kWarps * 32, 0, stream>>>(p, g);
  TESSERA_LAUNCH_CHECK();
  if (k_rows > 0)
    attention_dkdv_kernel<T><<<unsigned(runtime::ceil_div(k_rows, kWarps)), kWarps * 32, 0, stream>>>(p, g);
  TESSERA_LAUNCH_CHECK();
}

// The generic tier: any dtype, strides and head dimension; deterministic.
struct GenericTier {
  static constexpr const char* kName = "generic";
  static constexpr const char* kWhen =
      "any dtype, strides and head_dim <= 256: a warp per query row for dq, then a warp per key row for dk "
      "and dv, each summed in a fixed order";
  struct Plan {
    int64_t q_rows = 0, k_rows = 0;
    std::string describe() const {
      return std::to_string(runtime::ceil_div(q_rows, int64_t(kWarps))) + " CTAs for dq, " +
             std::to_string(runtime::ceil_div(k_rows, int64_t(kWarps))) + " for dk and dv, " +
             std::to_string(kWarps) + " warps each";
    }
  };
  static bool can_implement(const attn::BackwardCall&, const attn::TierCtx& c) {
    return c.allows(AttentionTier::generic);
  }
  static Plan plan(const attn::BackwardCall& c, const attn::TierCtx&) {
    const Params& p = c.p;
    return {p.batch * p.heads_q * p.seq_q, p.batch * (p.heads_q / p.group) * p.seq_k};
  }
  static void launch(const attn::BackwardCall& c, const Plan&, cudaStream_t stream) {
    const Params& p = c.p;
    const attn::BackwardArgs& a = c.a;
    runtime::Scratch delta(
        std::max<int64_t>({1, p.batch * p.heads_q * p.seq_q, p.heads_q * p.total_q}) * sizeof(float), stream);
    const Grad g{a.dout, p.out, a.lse, delta.as<float>(), a.dq, a.dk, a.dv, a.sdo, a.sdq, a.sdk, a.sdv};
    switch (p.dtype) {
      case DType::float32: launch_typed<float>(p, g, stream); break;
      case DType::float16: launch_typed<__half>(p, g, stream); break;
      default: launch_typed<__nv_bfloat16>(p, g, stream); break;
    }
  }
};

void check_grad(const char* op, const char* arg, const TensorView& t, const char* like_arg, const TensorView& like) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_dtype(op, arg, t, like_arg, like);
  detail::check_same_device(op, arg, t, like_arg, like);
  bool same = t.ndim == like.ndim;
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == like.shape[d];
  if (!same) detail::throw_arg(ErrorKind::value, op, arg, std::string("the shape of '") + like_arg + "'", "another shape");
}

// The checks every backward shares (on 4-d views), then the launch with `p` as the caller
// resolved it.
void check_backward(const char* op, const TensorView& grad_out, const TensorView& q, const TensorView& k,
                    const TensorView& v, const TensorView& out, const TensorView& lse, const TensorView& dq,
                    const TensorView& dk, const TensorView& dv, const AttentionOptions& options) {
  attn::check_arguments(op, q, k, v, out, &lse, options);
  check_grad(op, "grad_out", grad_out, "out", out);
  check_grad(op, "dq", dq, "q", q);
  check_grad(op, "dk", dk, "k", k);
  check_grad(op, "dv", dv, "v", v);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}) {
    detail::check_no_internal_overlap(op, arg, *t);
    for (const auto& [in, u] : {std::pair<const char*, const TensorView*>{"grad_out", &grad_out}, {"q", &q},
                                {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}})
      detail::check_no_overlap(op, arg, *t, in, *u, false);
  }
  detail::check_no_overlap(op, "dq", dq, "dk", dk, false);
  detail::check_no_overlap(op, "dq", dq, "dv", dv, false);
  detail::check_no_overlap(op, "dk", dk, "dv", dv, false);
  if (options.tier == AttentionTier::decode)
    detail::throw_arg(ErrorKind::value, op, "tier", "automatic, generic or sm90 (the backward has no decode tier)",
                      "decode");
}

// Runs the first tier that takes the call (its windows resolved), of those `tier` allows; sm90
// named where it cannot take the call is an error.
void run_backward(const char* op, Params p, const TensorView& grad_out, const TensorView& lse, const TensorView& dq,
                  const TensorView& dk, const TensorView& dv, AttentionTier tier, cudaStream_t stream) {
  attn::resolve_windows(p);
  const attn::BackwardCall c{p, {grad_out.data, attn::strides_of(grad_out), static_cast<const float*>(lse.data),
                                 dq.data, dk.data, dv.data, attn::strides_of(dq), attn::strides_of(dk),
                                 attn::strides_of(dv)}};
  const attn::TierCtx ctx{tier, stream};
  if (tier == AttentionTier::sm90 && !attn::Sm90BackwardTier::can_implement(c, ctx))
    detail::throw_arg(ErrorKind::value, op, "tier",
                      "a call the sm90 tier takes (Hopper, bfloat16/float16, head_dim = head_dim_v in {64, 128}, "
                      "the head dimension contiguous, 16-byte aligned rows)",
                      "sm90");
  runtime::run_first<attn::Sm90BackwardTier, GenericTier>(op, c, ctx, stream);
}

}  // namespace

void attention_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& options, cudaStream_t stream) {
  check_backward(kOp, grad_out, q, k, v, out, lse, dq, dk, dv, options);
  attn::check_alibi(kOp, options, q, q.shape[0], q.shape[2]);
  if (dq.numel() + dk.numel() + dv.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  run_backward(kOp, attn::params_of(q, k, v, out, options), grad_out, lse, dq, dk, dv, options.tier, stream);
}

void attention_varlen_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                               const AttentionOptions& options, cudaStream_t stream) {
  constexpr const char* op = "attention_varlen_backward";
  attn::check_packed(op, q, k, v, out, &lse);
  using attn::as_batch_of_one;
  const TensorView q4 = as_batch_of_one(q), k4 = as_batch_of_one(k), v4 = as_batch_of_one(v), o4 = as_batch_of_one(out);
  check_backward(op, grad_out.ndim == 3 ? as_batch_of_one(grad_out) : grad_out, q4, k4, v4, o4, as_batch_of_one(lse),
                 dq.ndim == 3 ? as_batch_of_one(dq) : dq, dk.ndim == 3 ? as_batch_of_one(dk) : dk,
                 dv.ndim == 3 ? as_batch_of_one(dv) : dv, options);
  const attn::Varlen vl = attn::check_varlen(op, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, stream);
  attn::check_alibi(op, options, q, vl.batch, q.shape[1]);
  if (dq.numel() + dk.numel() + dv.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  Params p = attn::params_of(q4, k4, v4, o4, options);
  attn::use_varlen(p, cu_seqlens_q, cu_seqlens_k, vl.batch, max_seqlen_q, max_seqlen_k, q.shape[0], k.shape[0]);
  run_backward(op, p, as_batch_of_one(grad_out), lse, as_batch_of_one(dq), as_batch_of_one(dk), as_batch_of_one(dv),
               options.tier, stream);
}

}  // namespace tessera
