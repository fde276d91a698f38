// attention_backward: dq, dk, dv of attention (tessera/ops/attention.hpp).
//
// With P = exp(S - lse) recomputed from the forward's lse, and delta_i = dO_i . O_i:
//   dV_j = sum_i P_ij dO_i,   dS_ij = P_ij (dO_i . V_j - delta_i) (times the soft-cap's
//   derivative 1 - tanh^2), dQ_i = scale sum_j dS_ij K_j, dK_j = scale sum_i dS_ij Q_i.
// The generic tier: a warp per query row for delta and dQ, then a warp per key row (over the
// query heads of its group) for dK and dV; each gradient row is summed by one warp in a fixed
// order, so the results are deterministic, with no atomics. Any strides, head dimensions up to 256.
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

// P_ij and the factor dS_ij = P_ij (dp - delta_i) * factor, from the raw score q_i . k_j.
struct Prob {
  float p, factor;
};
__device__ __forceinline__ Prob prob(float qk, const Params& p, float lse) {
  float s = qk * p.scale, factor = 1.f;
  if (p.softcap > 0.f) {
    const float t = tanhf(s / p.softcap);
    s = p.softcap * t, factor = 1.f - t * t;
  }
  return {lse == INFINITY ? 0.f : expf(s - lse), factor};
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attention_dq_kernel(Params p, Grad g) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.batch * p.heads_q * p.seq_q) return;
  const int64_t i = row % p.seq_q, h = row / p.seq_q % p.heads_q, b = row / p.seq_q / p.heads_q, hk = h / p.group;
  float q[kVals], dout[kVals], x[kVals], acc[kVals] = {};
  load_row(q, static_cast<const T*>(p.q) + b * p.sq.b + i * p.sq.s + h * p.sq.h, p.sq.d, p.dim, lane);
  load_row(dout, static_cast<const T*>(g.dout) + b * g.sdo.b + i * g.sdo.s + h * g.sdo.h, g.sdo.d, p.dim_v, lane);
  load_row(x, static_cast<const T*>(g.out) + b * p.so.b + i * p.so.s + h * p.so.h, p.so.d, p.dim_v, lane);
  const float delta = dot(dout, x), lse = g.lse[row];
  if (lane == 0) g.delta[row] = delta;
  const T* k = static_cast<const T*>(p.k) + b * p.sk.b + hk * p.sk.h;
  const T* v = static_cast<const T*>(p.v) + b * p.sv.b + hk * p.sv.h;
  const attn::KeyRange r = attn::key_range(i, p.seq_q, p.seq_k, p.causal, p.window_left, p.window_right);
  for (int64_t j = r.lo; j <= r.hi; ++j) {
    load_row(x, k + j * p.sk.s, p.sk.d, p.dim, lane);
    const Prob pr = prob(dot(q, x), p, lse);
    float vj[kVals];
    load_row(vj, v + j * p.sv.s, p.sv.d, p.dim_v, lane);
    const float ds = pr.p * (dot(dout, vj) - delta) * pr.factor;
#pragma unroll
    for (int c = 0; c < kVals; ++c) acc[c] += ds * x[c];
  }
  store_row(static_cast<T*>(g.dq) + b * g.sdq.b + i * g.sdq.s + h * g.sdq.h, g.sdq.d, acc, p.scale, p.dim, lane);
}

// The queries of one head that see key j: i in [lo, hi] (the key ranges inverted).
__device__ __forceinline__ attn::KeyRange query_range(int64_t j, const Params& p) {
  const int64_t off = p.seq_k - p.seq_q;
  int64_t lo = 0, hi = p.seq_q - 1;
  if (p.causal) lo = max(lo, j - off);
  if (p.window_right >= 0) lo = max(lo, j - off - p.window_right);
  if (p.window_left >= 0) hi = min(hi, j - off + p.window_left);
  return {lo, hi};
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) attention_dkdv_kernel(Params p, Grad g) {
  const int lane = threadIdx.x % 32;
  const int64_t heads_kv = p.heads_q / p.group;
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= p.batch * heads_kv * p.seq_k) return;
  const int64_t j = row % p.seq_k, hk = row / p.seq_k % heads_kv, b = row / p.seq_k / heads_kv;
  float k[kVals], v[kVals], dk[kVals] = {}, dv[kVals] = {};
  load_row(k, static_cast<const T*>(p.k) + b * p.sk.b + j * p.sk.s + hk * p.sk.h, p.sk.d, p.dim, lane);
  load_row(v, static_cast<const T*>(p.v) + b * p.sv.b + j * p.sv.s + hk * p.sv.h, p.sv.d, p.dim_v, lane);
  const attn::KeyRange qr = query_range(j, p);
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const T* q = static_cast<const T*>(p.q) + b * p.sq.b + h * p.sq.h;
    const T* dout = static_cast<const T*>(g.dout) + b * g.sdo.b + h * g.sdo.h;
    const int64_t stats = (b * p.heads_q + h) * p.seq_q;
    for (int64_t i = qr.lo; i <= qr.hi; ++i) {
      float qi[kVals], di[kVals];
      load_row(qi, q + i * p.sq.s, p.sq.d, p.dim, lane);
      load_row(di, dout + i * g.sdo.s, g.sdo.d, p.dim_v, lane);
      const Prob pr = prob(dot(qi, k), p, g.lse[stats + i]);
      const float ds = pr.p * (dot(di, v) - g.delta[stats + i]) * pr.factor;
#pragma unroll
      for (int c = 0; c < kVals; ++c) dv[c] += pr.p * di[c], dk[c] += ds * qi[c];
    }
  }
  store_row(static_cast<T*>(g.dk) + b * g.sdk.b + j * g.sdk.s + hk * g.sdk.h, g.sdk.d, dk, p.scale, p.dim, lane);
  store_row(static_cast<T*>(g.dv) + b * g.sdv.b + j * g.sdv.s + hk * g.sdv.h, g.sdv.d, dv, 1.f, p.dim_v, lane);
}

template <class T>
void launch(const Params& p, const Grad& g, cudaStream_t stream) {
  const int64_t q_rows = p.batch * p.heads_q * p.seq_q, k_rows = p.batch * (p.heads_q / p.group) * p.seq_k;
  if (q_rows > 0)
    attention_dq_kernel<T><<<unsigned(runtime::ceil_div(q_rows, kWarps)), kWarps * 32, 0, stream>>>(p, g);
  TESSERA_LAUNCH_CHECK();
  if (k_rows > 0)
    attention_dkdv_kernel<T><<<unsigned(runtime::ceil_div(k_rows, kWarps)), kWarps * 32, 0, stream>>>(p, g);
  TESSERA_LAUNCH_CHECK();
}

void check_grad(const char* arg, const TensorView& t, const char* like_arg, const TensorView& like) {
  detail::check_cuda_tensor(kOp, arg, t);
  detail::check_same_dtype(kOp, arg, t, like_arg, like);
  detail::check_same_device(kOp, arg, t, like_arg, like);
  bool same = t.ndim == like.ndim;
  for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == like.shape[d];
  if (!same) detail::throw_arg(ErrorKind::value, kOp, arg, std::string("the shape of '") + like_arg + "'", "another shape");
}

}  // namespace

void attention_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& options, cudaStream_t stream) {
  attn::check_arguments(kOp, q, k, v, out, &lse, options);
  check_grad("grad_out", grad_out, "out", out);
  check_grad("dq", dq, "q", q);
  check_grad("dk", dk, "k", k);
  check_grad("dv", dv, "v", v);
  for (const auto& [arg, t] : {std::pair<const char*, const TensorView*>{"dq", &dq}, {"dk", &dk}, {"dv", &dv}}) {
    detail::check_no_internal_overlap(kOp, arg, *t);
    for (const auto& [in, u] : {std::pair<const char*, const TensorView*>{"grad_out", &grad_out}, {"q", &q},
                                {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}})
      detail::check_no_overlap(kOp, arg, *t, in, *u, false);
  }
  detail::check_no_overlap(kOp, "dq", dq, "dk", dk, false);
  detail::check_no_overlap(kOp, "dq", dq, "dv", dv, false);
  detail::check_no_overlap(kOp, "dk", dk, "dv", dv, false);
  if (options.tier == AttentionTier::sm90)
    detail::throw_arg(ErrorKind::value, kOp, "tier", "automatic or generic (the backward has no sm90 tier yet)", "sm90");
  if (dq.numel() + dk.numel() + dv.numel() == 0) return;
  runtime::DeviceGuard guard(q.device.index);
  Params p{};
  p.dtype = q.dtype, p.device = q.device.index;
  p.q = q.data, p.k = k.data, p.v = v.data;
  p.sq = attn::strides_of(q), p.sk = attn::strides_of(k), p.sv = attn::strides_of(v), p.so = attn::strides_of(out);
  p.batch = q.shape[0], p.seq_q = q.shape[1], p.seq_k = k.shape[1], p.heads_q = q.shape[2];
  p.group = q.shape[2] / k.shape[2], p.dim = q.shape[3], p.dim_v = v.shape[3];
  p.scale = static_cast<float>(options.scale > 0 ? options.scale : 1.0 / std::sqrt(static_cast<double>(q.shape[3])));
  p.softcap = static_cast<float>(options.softcap);
  p.causal = options.causal, p.window_left = options.window_left, p.window_right = options.window_right;
  runtime::Scratch delta(std::max<int64_t>(1, p.batch * p.heads_q * p.seq_q) * sizeof(float), stream);
  Grad g{grad_out.data, out.data, static_cast<const float*>(lse.data), delta.as<float>(), dq.data, dk.data, dv.data,
         attn::strides_of(grad_out), attn::strides_of(dq), attn::strides_of(dk), attn::strides_of(dv)};
  switch (q.dtype) {
    case DType::float32: launch<float>(p, g, stream); break;
    case DType::float16: launch<__half>(p, g, stream); break;
    default: launch<__nv_bfloat16>(p, g, stream); break;
  }
}

}  // namespace tessera
