// jsd: the generalized Jensen-Shannon divergence of each row of a student's logits from a teacher's,
// and its gradient with respect to the student's logits, in one kernel (tessera/ops/loss.hpp).
//
// A CTA takes a row at a time, as cross_entropy's (a persistent grid; one 1024-thread CTA per SM
// for long rows, smaller CTAs, several per SM, for short ones), and streams both rows together,
// two 16-byte loads of each in flight per thread. Work is in log2 units: u = student log2(e) / T,
// v = teacher log2(e) / T, so that every exponential is one MUFU ex2 of a difference, exact (2^0)
// at a row's maximum.
//   Pass 1: the online max and sum of 2^u and of 2^v (merged by tile/online_softmax.cuh's weights
//     in log2 units), for beta 0 and 1 also the sum of P (v - u) (or Q (u - v)) rescaled with
//     them: the whole KL, so that beta 0 and 1 need one pass for the loss and a second for the
//     gradient.
//   Pass 2 (0 < beta < 1): the log of the mixture, lM = logaddexp(lP + log beta, lQ + log(1 - beta)),
//     and the sums of P (lP - lM) and Q (lQ - lM): the loss, and S, which the gradient needs.
//   Pass 3 (or 2): the gradient, written (over the student where asked).
// The passes after the first read the rows again from L2 where they are still there (pass 1 and
// 2 mark their lines evict-last, the row's last pass evict-first) and walk them in alternate
// directions, so that each starts on the columns read last. Two rows per SM in flight outgrow L2
// sooner than cross_entropy's one (at V = 128k in bf16, 512 KB an SM), and the later passes then
// read part of the rows from HBM again.
//
// The gradient, d loss / d s_j with s = student / T, times 1 / T:
//   beta 0: Q_j - P_j;  beta 1: Q_j (lQ_j - lP_j - loss);
//   else, g_j = (1 - beta)(lQ_j - lM_j), S = sum_j Q_j g_j:  Q_j (g_j - S).
// A term whose probability is 0 is 0 (0 log 0), so masked classes (a logit of -inf in either row)
// give finite results where the divergence is finite; NaN logits give NaN.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/loss/cross_entropy.cuh"
#include "ops/loss/reduce.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/loss.hpp"
#include "tile/activation.cuh"
#include "tile/constants.cuh"
#include "tile/frag.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace tessera {
namespace {

constexpr const char* kOp = "jsd";
using ce::kThreads;
constexpr int kPairs = 2;  // 16-byte loads of each row in flight per thread (four loads in all)

// beta 0: KL(P || Q); beta 1: KL(Q || P); otherwise the mixture's divergence.
enum class Kind { forward, reverse, mixed };

struct JsdArgs {
  const void* student;
  const void* teacher;
  void* grad;               // null: not written
  int64_t ss, ts, gs;       // row strides, elements
  const int64_t* target;    // null: no row ignored
  int64_t ignore, rows;
  int classes;
  float scale;              // log2(e) / T
  float beta, log2_beta, log2_rest;  // log2(beta), log2(1 - beta): the mixture's (mixed only)
  float grad_scale;         // the gradient's factor (Kind's; the 1 / T of d s / d student in it)
  float* loss;              // [rows]
};

// Pass 1's accumulator: the online states of 2^u (q) and 2^v (p), each against its running max,
// and kl: forward, sum 2^(v - mp) (v - u); reverse, sum 2^(u - mq) (u - v); mixed: unused.
struct Acc {
  float mq, sq, mp, sp, kl;
};
__device__ __forceinline__ Acc empty_acc() { return {-INFINITY, 0.f, -INFINITY, 0.f, 0.f}; }

// Two states merge at the larger maxima, each sum (and kl, with the sum of its weights) rescaled
// by 2^(m - M); products rounded separately, so that merge(a, b) and merge(b, a) give the same bits
// on every lane of a butterfly.
template <Kind K>
struct AccMerge {
  __device__ Acc operator()(Acc a, Acc b) const {
    const float mq = fmaxf(a.mq, b.mq), mp = fmaxf(a.mp, b.mp);
    const float aq = tile::merge_weight<tile::Base::two>(a.mq, mq), bq = tile::merge_weight<tile::Base::two>(b.mq, mq);
    const float ap = tile::merge_weight<tile::Base::two>(a.mp, mp), bp = tile::merge_weight<tile::Base::two>(b.mp, mp);
    const auto mix = [](float x, float wx, float y, float wy) { return __fadd_rn(__fmul_rn(x, wx), __fmul_rn(y, wy)); };
    const float kl = K == Kind::forward ? mix(a.kl, ap, b.kl, bp) : K == Kind::reverse ? mix(a.kl, aq, b.kl, bq) : 0.f;
    return {mq, mix(a.sq, aq, b.sq, bq), mp, mix(a.sp, ap, b.sp, bp), kl};
  }
};

// Pass 2's sums (mixed): sum P (lP - lM) and sum Q (lQ - lM), in log2 units.
struct Sums {
  float p, q;
};
struct SumsAdd {
  __device__ Sums operator()(Sums a, Sums b) const { return {a.p + b.p, a.q + b.q}; }
};

// w x, 0 where the weight w is 0 (x may then be infinite: a masked class).
__device__ __forceinline__ float weighted(float w, float x) { return w == 0.f ? 0.f : w * x; }

// Adds one vector of both rows to the states: each row's max first, one rescale test per vector,
// then one ex2 per element and row. A state that has seen nothing but -inf keeps its sum at 0
// (exponents against 0 rather than -inf, so that a NaN still reaches the sum).
template <Kind K, int W>
__device__ __forceinline__ void add(Acc& a, const float (&u)[W], const float (&v)[W]) {
  float mu = u[0], mv = v[0];
#pragma unroll
  for (int i = 1; i < W; ++i) mu = fmaxf(mu, u[i]), mv = fmaxf(mv, v[i]);
  if (mu > a.mq) {
    const float r = tile::ex2_approx(a.mq - mu);
    a.sq *= r, a.mq = mu;
    if constexpr (K == Kind::reverse) a.kl *= r;
  }
  if (mv > a.mp) {
    const float r = tile::ex2_approx(a.mp - mv);
    a.sp *= r, a.mp = mv;
    if constexpr (K == Kind::forward) a.kl *= r;
  }
  const float mq = a.mq == -INFINITY ? 0.f : a.mq, mp = a.mp == -INFINITY ? 0.f : a.mp;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float eq = tile::ex2_approx(u[i] - mq), ep = tile::ex2_approx(v[i] - mp);
    a.sq += eq, a.sp += ep;
    if constexpr (K == Kind::forward) a.kl += weighted(ep, v[i] - u[i]);
    if constexpr (K == Kind::reverse) a.kl += weighted(eq, u[i] - v[i]);
  }
}

// log2 of the mixture beta P + (1 - beta) Q at one class, from lP and lQ (log2 units), as
// logaddexp: no underflow where both probabilities are tiny. NaN where both are 0 (their terms
// are then 0 by `weighted`).
__device__ __forceinline__ float log2_mixture(const JsdArgs& a, float lp, float lq) {
  const float x = lp + a.log2_beta, y = lq + a.log2_rest, hi = fmaxf(x, y);
  return hi + __log2f(1.f + tile::ex2_approx(fminf(x, y) - hi));
}

// Columns [0, n) of both rows (x, y: the student's and teacher's, from column col0 of the row) in
// blocks of kPairs vectors of VW per thread, from the first block or (backward) the last, each
// vector scaled to log2 units and handed to f(column in the row, u, v).
template <class T, int VW, class F>
__device__ __forceinline__ void walk(const JsdArgs& a, const T* x, const T* y, int col0, int n, uint64_t policy,
                                     bool backward, F&& f) {
  const int step = int(blockDim.x) * VW, block = kPairs * step, blocks = (n + block - 1) / block;
  for (int b = 0; b < blocks; ++b) {
    const int c0 = (backward ? blocks - 1 - b : b) * block + int(threadIdx.x) * VW;
    tile::Frag<T, VW> fx[kPairs], fy[kPairs];
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      if (c0 + k * step >= n) continue;
      fx[k] = tile::load_frag_hint<T, VW>(x + col0 + c0 + k * step, policy);
      fy[k] = tile::load_frag_hint<T, VW>(y + col0 + c0 + k * step, policy);
    }
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      if (c0 + k * step >= n) continue;
      // Rounded here, never contracted into a later FMA: every use (the maxima, the exponents,
      // v - u) sees the same values, so that a row's maximum gives 2^0 = 1 exactly and the KLs'
      // like terms cancel exactly (one class: 0).
      float u[VW], v[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) u[i] = __fmul_rn(fx[k][i], a.scale), v[i] = __fmul_rn(fy[k][i], a.scale);
      f(col0 + c0 + k * step, u, v);
    }
  }
}

// A whole row: the 16-byte body, and (kSplit) the scalar head and tail around it.
template <class T, int VW, bool kSplit, class F>
__device__ __forceinline__ void over_row(const JsdArgs& a, const T* x, const T* y, const ce::Split& sp, bool last,
                                         bool backward, F&& f) {
  const uint64_t policy = last ? tile::l2_policy<tile::L2Hint::kEvictFirst>() : tile::l2_policy<tile::L2Hint::kEvictLast>();
  const int end = sp.head + sp.body;
  if constexpr (kSplit) walk<T, 1>(a, x, y, 0, sp.head, policy, backward, f);
  walk<T, VW>(a, x, y, sp.head, sp.body, policy, backward, f);
  if constexpr (kSplit) walk<T, 1>(a, x, y, end, a.classes - end, policy, backward, f);
}

// An ignored row's gradient: zeros.
template <class T, int VW, bool kSplit>
__device__ __forceinline__ void zero_row(T* g, const ce::Split& sp, int n) {
  const int end = sp.head + sp.body;
  for (int c = sp.head + int(threadIdx.x) * VW; c < end; c += int(blockDim.x) * VW)
    tile::store_frag_stream(g + c, tile::splat<T, VW>(0.f));
  if constexpr (kSplit)
    for (int c = int(threadIdx.x); c < n - sp.body; c += int(blockDim.x))
      g[c < sp.head ? c : c + sp.body] = tile::from_float<T>(0.f);
}

// The width of a vector handed to a pass (1 in a row's scalar head and tail, else VW).
template <class A>
constexpr int kWidth = int(std::extent_v<std::remove_cv_t<std::remove_reference_t<A>>>);

template <class T, int VW, bool kSplit, Kind K>
__global__ void __launch_bounds__(kThreads, 1) jsd_kernel(JsdArgs a) {
  __shared__ Acc scratch[32];
  __shared__ Sums sums[32];
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(a.student) + r * a.ss;
    const T* y = static_cast<const T*>(a.teacher) + r * a.ts;
    T* g = a.grad ? static_cast<T*>(a.grad) + r * a.gs : nullptr;
    const ce::Split sp = ce::split_row<T, VW, kSplit>(x, a.classes);
    if (a.target && a.target[r] == a.ignore) {
      if (threadIdx.x == 0) a.loss[r] = 0.f;
      if (g) zero_row<T, VW, kSplit>(g, sp, a.classes);
      continue;
    }
    Acc acc = empty_acc();
    over_row<T, VW, kSplit>(a, x, y, sp, !g && K != Kind::mixed, false,
                            [&](int, const auto& u, const auto& v) { add<K>(acc, u, v); });
    acc = tile::block_reduce(acc, AccMerge<K>{}, empty_acc(), scratch);
    const float lse_q = acc.mq + log2f(acc.sq), lse_p = acc.mp + log2f(acc.sp);
    // The KLs as differences of like terms (the maxima, then the logs of the sums): with one
    // class, or equal rows, they cancel exactly.
    float loss = 0.f, s = 0.f;
    if constexpr (K == Kind::forward) {
      loss = tile::kLn2 * ((acc.kl / acc.sp - (acc.mp - acc.mq)) - (log2f(acc.sp) - log2f(acc.sq)));
    } else if constexpr (K == Kind::reverse) {
      s = acc.kl / acc.sq;  // E_Q[u - v]
      loss = tile::kLn2 * ((s - (acc.mq - acc.mp)) - (log2f(acc.sq) - log2f(acc.sp)));
    } else {
      Sums part{0.f, 0.f};
      over_row<T, VW, kSplit>(a, x, y, sp, !g, true, [&](int, const auto& u, const auto& v) {
#pragma unroll
        for (int i = 0; i < kWidth<decltype(u)>; ++i) {
          const float lq = u[i] - lse_q, lp = v[i] - lse_p, lm = log2_mixture(a, lp, lq);
          part.p += weighted(tile::ex2_approx(lp), lp - lm);
          part.q += weighted(tile::ex2_approx(lq), lq - lm);
        }
      });
      const Sums t = tile::block_reduce(part, SumsAdd{}, Sums{0.f, 0.f}, sums);
      s = t.q;
      loss = tile::kLn2 * (a.beta * t.p + (1.f - a.beta) * t.q);
    }
    if (threadIdx.x == 0) a.loss[r] = loss;
    if (!g) continue;
    over_row<T, VW, kSplit>(a, x, y, sp, true, K != Kind::mixed, [&](int c, const auto& u, const auto& v) {
      constexpr int W = kWidth<decltype(u)>;
      float out[W];
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float lq = u[i] - lse_q, q = tile::ex2_approx(lq);
        if constexpr (K == Kind::forward) out[i] = (q - tile::ex2_approx(v[i] - lse_p)) * a.grad_scale;
        else if constexpr (K == Kind::reverse) out[i] = weighted(q, (u[i] - v[i]) - s) * a.grad_scale;
        else out[i] = weighted(q, (lq - log2_mixture(a, v[i] - lse_p, lq)) - s) * a.grad_scale;
      }
      tile::store_frag_stream(g + c, tile::pack<T, W>(out));
    });
  }
}

// ---- host: the tiers (runtime/tier.hpp) ---------------------------------------------------------
// cross_entropy's three ways of reading a row (loss::Access).
using loss::Access;
using loss::RowsPlan;

struct Call {
  JsdArgs a;
  DType dtype;
  Kind kind;
  bool same_alignment;  // the teacher's and gradient's rows lie as the student's do against 16-byte boundaries
  bool vectorizable;    // every row 16-byte aligned, V a multiple of the vector
};

template <class T, int VW, bool kSplit>
void launch_kind(const Call& c, const RowsPlan& p, cudaStream_t stream) {
  switch (c.kind) {
    case Kind::forward: return jsd_kernel<T, VW, kSplit, Kind::forward><<<p.grid, p.threads, 0, stream>>>(c.a);
    case Kind::reverse: return jsd_kernel<T, VW, kSplit, Kind::reverse><<<p.grid, p.threads, 0, stream>>>(c.a);
    default: return jsd_kernel<T, VW, kSplit, Kind::mixed><<<p.grid, p.threads, 0, stream>>>(c.a);
  }
}

// A CTA per row (loss::rows_plan, kPairs loads of each row in flight). The CTA's size is a launch
// argument (one kernel per dtype, access and kind: the three passes and kinds already make 27).
template <Access A>
struct RowTier {
  static constexpr const char* kName = A == Access::vectors ? "vectors" : A == Access::split ? "split" : "scalar";
  static constexpr const char* kWhen =
      A == Access::vectors ? "rows 16-byte aligned, V a multiple of the vector: a CTA per row, 16-byte loads"
      : A == Access::split ? "the teacher's and gradient's rows at the student's offsets from 16-byte boundaries: "
                             "a CTA per row, 16-byte loads between a scalar head and tail"
                           : "any rows: a CTA per row, element loads";
  static bool can_implement(const Call& c, const cudaDeviceProp&) {
    if constexpr (A == Access::vectors) return c.same_alignment && c.vectorizable;
    else if constexpr (A == Access::split) return c.same_alignment;
    else return true;
  }
  static RowsPlan plan(const Call& c, const cudaDeviceProp& prop) {
    return loss::rows_plan(c.a.rows, c.a.classes, A == Access::scalar ? 1 : 16 / int(dtype_size(c.dtype)), kPairs,
                           kThreads, prop.multiProcessorCount);
  }
  static void launch(const Call& c, const RowsPlan& p, cudaStream_t stream) {
    const auto run = [&](auto t) {
      using T = decltype(t);
      if constexpr (A == Access::scalar) launch_kind<T, 1, false>(c, p, stream);
      else launch_kind<T, 16 / sizeof(T), A == Access::split>(c, p, stream);
    };
    switch (c.dtype) {
      case DType::float32: run(float{}); break;
      case DType::float16: run(__half{}); break;
      default: run(__nv_bfloat16{}); break;
    }
    TESSERA_LAUNCH_CHECK();
  }
};

// The 16-byte tiers' conditions on a row-major [N, V] view against the student: the same offset
// from a 16-byte boundary on every row (the same first offset and row strides equal modulo 16
// bytes), and rows that start aligned with V filling the vectors.
bool same_alignment(const TensorView& s, const TensorView& t) {
  const int64_t e = int64_t(dtype_size(s.dtype));
  const auto offset = [](const TensorView& v) { return reinterpret_cast<uintptr_t>(v.data) % 16; };
  return offset(s) == offset(t) && (s.shape[0] <= 1 || (s.strides[0] * e) % 16 == (t.strides[0] * e) % 16);
}
bool vectorizable(const TensorView& t) {
  const int64_t vw = 16 / int64_t(dtype_size(t.dtype));
  return t.shape[1] % vw == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.shape[0] <= 1 || t.strides[0] % vw == 0);
}

std::string dims_and_stride(const TensorView& t) {
  return detail::dims(t) + (t.ndim == 2 ? ", class stride " + std::to_string(t.strides[1]) : std::string());
}

// A row-wise [N, V] operand: 2-d, the class dimension contiguous.
void check_rows(const char* arg, const TensorView& t, bool classes_limit) {
  const bool ok = t.ndim == 2 && (t.strides[1] == 1 || t.shape[1] <= 1) &&
                  (!classes_limit || (t.shape[1] >= 1 && t.shape[1] <= INT32_MAX - 65536));
  if (!ok)
    detail::throw_arg(ErrorKind::value, kOp, arg,
                      classes_limit ? "a 2-d tensor [N, V] with 1 <= V < 2^31 - 2^16 and the class dimension contiguous"
                                    : "the class dimension contiguous",
                      dims_and_stride(t));
}

void check(const TensorView& student, const TensorView& teacher, const TensorView* target, const TensorView& loss,
           const TensorView* grad, const JsdOptions& o) {
  detail::check_cuda_tensor(kOp, "student", student);
  detail::check_dtype_in(kOp, "student", student, {DType::float32, DType::float16, DType::bfloat16});
  check_rows("student", student, true);
  detail::check_like(kOp, "teacher", teacher, "student", student);
  check_rows("teacher", teacher, false);
  const std::string n = std::to_string(student.shape[0]);
  if (target) {
    detail::check_cuda_tensor(kOp, "target", *target);
    detail::check_dtype_in(kOp, "target", *target, {DType::int64});
    detail::check_same_device(kOp, "target", *target, "student", student);
    if (target->ndim != 1 || target->shape[0] != student.shape[0] || (target->strides[0] != 1 && target->shape[0] > 1))
      detail::throw_arg(ErrorKind::value, kOp, "target", "a contiguous 1-d int64 tensor of student's N = " + n,
                        dims_and_stride(*target));
  }
  detail::check_cuda_tensor(kOp, "loss", loss);
  detail::check_dtype_in(kOp, "loss", loss, {DType::float32});
  detail::check_same_device(kOp, "loss", loss, "student", student);
  if (loss.ndim != 1 || loss.shape[0] != student.shape[0] || (loss.strides[0] != 1 && loss.shape[0] > 1))
    detail::throw_arg(ErrorKind::value, kOp, "loss", "a contiguous 1-d float32 tensor of student's N = " + n,
                      dims_and_stride(loss));
  detail::check_no_overlap(kOp, "loss", loss, "student", student, false);
  detail::check_no_overlap(kOp, "loss", loss, "teacher", teacher, false);
  if (target) detail::check_no_overlap(kOp, "loss", loss, "target", *target, false);
  if (grad) {
    detail::check_like(kOp, "grad", *grad, "student", student);
    check_rows("grad", *grad, false);
    detail::check_no_internal_overlap(kOp, "grad", *grad);
    detail::check_no_overlap(kOp, "grad", *grad, "student", student, true);
    detail::check_no_overlap(kOp, "grad", *grad, "teacher", teacher, false);
    detail::check_no_overlap(kOp, "grad", *grad, "loss", loss, false);
    if (target) detail::check_no_overlap(kOp, "grad", *grad, "target", *target, false);
  }
  if (!(o.beta >= 0.0 && o.beta <= 1.0))
    detail::throw_arg(ErrorKind::value, kOp, "beta", "a number in [0, 1]", std::to_string(o.beta));
  if (!(o.temperature > 0.0) || !std::isfinite(o.temperature))
    detail::throw_arg(ErrorKind::value, kOp, "temperature", "a finite number > 0", std::to_string(o.temperature));
}

}  // namespace

void jsd(const TensorView& student, const TensorView& teacher, const TensorView* target, const TensorView& loss,
         const TensorView* grad, const JsdOptions& options, cudaStream_t stream) {
  check(student, teacher, target, loss, grad, options);
  const int64_t rows = student.shape[0];
  if (rows == 0) return;
  runtime::DeviceGuard guard(student.device.index);
  const double beta = options.beta, inv_t = 1.0 / options.temperature;
  const Kind kind = beta == 0.0 ? Kind::forward : beta == 1.0 ? Kind::reverse : Kind::mixed;
  JsdArgs a{};
  a.student = student.data, a.teacher = teacher.data, a.grad = grad ? grad->data : nullptr;
  a.ss = student.strides[0], a.ts = teacher.strides[0], a.gs = grad ? grad->strides[0] : 0;
  a.target = target ? static_cast<const int64_t*>(target->data) : nullptr;
  a.ignore = options.ignore_index, a.rows = rows, a.classes = int(student.shape[1]);
  a.scale = float(tile::kLog2eDouble * inv_t);
  a.beta = float(beta);
  a.log2_beta = kind == Kind::mixed ? float(std::log2(beta)) : 0.f;
  a.log2_rest = kind == Kind::mixed ? float(std::log2(1.0 - beta)) : 0.f;
  const double ln2 = std::log(2.0);
  a.grad_scale = float(kind == Kind::forward ? inv_t : kind == Kind::reverse ? ln2 * inv_t : (1.0 - beta) * ln2 * inv_t);
  a.loss = static_cast<float*>(loss.data);
  const bool aligned = same_alignment(student, teacher) && (!grad || same_alignment(student, *grad));
  const bool vec = vectorizable(student) && vectorizable(teacher) && (!grad || vectorizable(*grad));
  const Call c{a, student.dtype, kind, aligned, vec};
  runtime::run_first<RowTier<Access::vectors>, RowTier<Access::split>, RowTier<Access::scalar>>(
      kOp, c, runtime::device_props(student.device.index), stream);
}

namespace {
// jsd with its options as plain arguments, in the schema's order (the description's generic
// kernel): the op and its in-place overload, whose gradient is the student.
void jsd_args(const TensorView& student, const TensorView& teacher, const TensorView* target, double beta,
              double temperature, int64_t ignore_index, const TensorView& loss, const TensorView* grad,
              cudaStream_t stream) {
  JsdOptions o;
  o.beta = beta, o.temperature = temperature, o.ignore_index = ignore_index;
  jsd(student, teacher, target, loss, grad, o, stream);
}

// The loss of each row (float32 [N], no reduction) and (with_grad) its gradient for a loss gradient
// of 1 per row. No autograd formula: a caller scales the gradient in place by the loss's
// (cross_entropy.backward with reduction 'none') in its own backward.
const char* const kOptions = "float beta=0.5, float temperature=1.0, int ignore_index=-100";
const OpRegistrar kJsd =
    describe("jsd", "loss",
             "generalized Jensen-Shannon divergence of student logits [N, V] from teacher logits per row "
             "(distillation), with the student's gradient in the same pass")
        .schema(std::string("jsd(Tensor student, Tensor teacher, Tensor? target=None, *, ") + kOptions +
                ", bool with_grad=False) -> (Tensor, Tensor)")
        .kernel<&jsd_args>({"student", "teacher", "target", "beta", "temperature", "ignore_index", "loss", "grad"},
                           {out::per_row("loss", "student"), out::like("grad", "student").when("with_grad")})
        .own_dtype_args({"target"})  // int64 rows' labels, only compared with ignore_index
        .overload(describe("jsd.inplace", "loss", "jsd with the gradient written over the student's logits")
                      .schema(std::string("jsd.inplace(Tensor(a!) student, Tensor teacher, Tensor? target=None, *, ") +
                              kOptions + ") -> Tensor")
                      .kernel<&jsd_args>({"student", "teacher", "target", "beta", "temperature", "ignore_index",
                                          "loss", "student"},
                                         {out::per_row("loss", "student")})
                      .own_dtype_args({"target"}));
}  // namespace
}  // namespace tessera
