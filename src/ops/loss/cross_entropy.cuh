// cross_entropy, device side: the row kernel and its two passes. The host side (checks, tiers,
// the mean's divisor and sum) is cross_entropy.cu; the kernels of the per-class mode (below) are
// instantiated in cross_entropy_classes.cu, the others in cross_entropy.cu, so each is compiled in
// one file only.
//
// Bytes: the loss needs the logits read once; the gradient, written in the same kernel, one
// write: 2 N V sizeof(T), the floor for training's forward plus backward. A CTA takes a row at a
// time (a persistent grid of one 1024-thread CTA per SM; for short rows smaller CTAs, several per
// SM): pass 1 streams the row into (max, sum of exp, sum) with four 16-byte loads in flight per
// thread, the CTA merges them, and pass 2 streams the row again, from its end, and writes the
// gradient. Pass 2 reads the row from L2 where it is still there: the rows in flight at once (one
// per SM, 256 KB each at V = 128k in bf16) fit in it; pass 1's loads mark their lines evict-last,
// and pass 2's loads and the gradient's stores mark theirs evict-first, so that they do not push
// out rows still to be read.
//
// Every row's loss is  rw (lse + z lse^2) - h y_t - sum_j u_j y_j  for per-class weights u_j, a
// weight h on the target's logit and rw = h + sum_j u_j, the weight on lse; its gradient is
// p_j rw (1 + 2 z lse) - u_j - h [j = t]. Where u is one constant, e / V (class indices without
// class weights, or with them but no smoothing: then the target's weight w_t multiplies the whole
// row), the kernels keep the sum of the logits only (Mode::plain, Mode::cap). Otherwise
// (probability targets q, u_j = w_j ((1 - e) q_j + e / V), h = 0; class weights with smoothing,
// u_j = w_j e / V, h = (1 - e) w_t) each pass also reads u_j (Mode::classes): the weights, and the
// row's probabilities beside its logits.
//
// Semantics as torch's F.cross_entropy: ignored rows add 0 and count for nothing in the mean; a
// mean over no rows is NaN. NaN logits give NaN. A class index out of range gives NaN (torch
// raises a device-side assertion; a NaN keeps the call free of synchronization).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

#include "tile/activation.cuh"
#include "tile/constants.cuh"
#include "tile/convert.cuh"
#include "tile/frag.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"

namespace tessera::ce {

constexpr int kThreads = 1024;  // a long row's CTA; shorter rows take fewer (RowTier::plan)
constexpr int kUnroll = 4;      // 16-byte loads in flight per thread

struct CeArgs {
  const void* logits;
  void* grad;  // null: not written
  int64_t ls, gs;  // row strides, elements
  const void* target;  // class indices, or (probs) rows of probabilities in the logits' dtype
  bool target64, probs;
  int64_t ts;  // the probabilities' row stride, elements
  int64_t rows, classes, ignore;
  float eps, z, cap;     // label smoothing, z-loss, soft-cap (0: none)
  const float* weight;   // class weights [classes]; null: all 1
  float* row_loss;       // [rows]: the output (none) or scratch (mean, sum)
  float* lse;            // nullable
  const float* divisor;  // mean: its divisor (device); else null
};

// plain and cap: u constant (the row's sum of logits suffices), the logits soft-capped in cap.
// classes: u per class, read in both passes; the cap a runtime test there (a rare combination,
// not worth a kernel of its own).
enum class Mode { plain, cap, classes };

// Per-thread, then per-row, accumulator: the online max and sum of exp, and the sum of logits
// (classes: of u_j y_j, with mass the sum of u_j).
struct Acc {
  float m, s, sum;
};
struct MassAcc : Acc {
  float mass;
};
struct AccMerge {
  __device__ Acc operator()(Acc a, Acc b) const {
    const tile::SoftmaxState e = tile::SoftmaxMerge{}({a.m, a.s}, {b.m, b.s});
    return {e.m, e.s, a.sum + b.sum};
  }
  __device__ MassAcc operator()(MassAcc a, MassAcc b) const {
    return {(*this)(static_cast<Acc>(a), static_cast<Acc>(b)), a.mass + b.mass};
  }
};
template <Mode M>
using AccOf = std::conditional_t<M == Mode::classes, MassAcc, Acc>;
template <Mode M>
__device__ __forceinline__ AccOf<M> empty_acc() {
  if constexpr (M == Mode::classes) return {{-INFINITY, 0.f, 0.f}, 0.f};
  else return {-INFINITY, 0.f, 0.f};
}

// The logit as the loss sees it: soft-capped (cap tanh(x / cap)) for a cap > 0, as it is in the
// others; and the gradient through the cap, 1 - tanh^2, from the capped value.
template <Mode M>
__device__ __forceinline__ float capped(float x, float cap) {
  if constexpr (M == Mode::cap) return cap * tanhf(x / cap);
  else if constexpr (M == Mode::classes) return cap > 0.f ? cap * tanhf(x / cap) : x;
  else return x;
}
template <Mode M>
__device__ __forceinline__ float through_cap(float d, float y, float cap) {
  if constexpr (M == Mode::cap) return d * (1.f - (y / cap) * (y / cap));
  else if constexpr (M == Mode::classes) return cap > 0.f ? d * (1.f - (y / cap) * (y / cap)) : d;
  else return d;
}

using tile::kLog2e;

// Vectors of the row in flight per thread: Mode::classes loads the row's probabilities beside its
// logits, so half as many vectors keep as many 16-byte loads in flight, in the registers that
// 1024 threads per SM allow (four each of both spill).
template <Mode M>
constexpr int kUnrollOf = M == Mode::classes ? kUnroll / 2 : kUnroll;

// The CTA's threads: THREADS, or where that is 0 (the soft-capped and per-class kernels), the
// launch's.
template <int THREADS>
__device__ __forceinline__ int cta_threads() { return THREADS ? THREADS : int(blockDim.x); }

// Adds one vector of (capped) logits to the online max and sum of exp: its max first, one rescale
// test per vector rather than per element, then each exp as one FFMA and one MUFU ex2 (in log2
// units against the running max).
template <int VW>
__device__ __forceinline__ void add_exps(Acc& a, const float (&y)[VW]) {
  float mv = y[0];
#pragma unroll
  for (int i = 1; i < VW; ++i) mv = fmaxf(mv, y[i]);
  if (mv > a.m) a.s *= tile::ex2_approx((a.m - mv) * kLog2e), a.m = mv;  // a.m = -inf: the sum so far is 0
  if (a.m == -INFINITY) return;  // nothing but -inf so far: adds 0 (a NaN still reaches the sum)
  const float m2 = a.m * kLog2e;
#pragma unroll
  for (int i = 0; i < VW; ++i) a.s += tile::ex2_approx(fmaf(y[i], kLog2e, -m2));
}
template <int VW>
__device__ __forceinline__ void add(Acc& a, const float (&y)[VW], const float (&)[VW]) {
#pragma unroll
  for (int i = 0; i < VW; ++i) a.sum += y[i];
  add_exps(a, y);
}
template <int VW>
__device__ __forceinline__ void add(MassAcc& a, const float (&y)[VW], const float (&u)[VW]) {
#pragma unroll
  for (int i = 0; i < VW; ++i) a.sum += u[i] * y[i], a.mass += u[i];
  add_exps(a, y);
}

// A row's per-class weights u_j = w_j (qa q_j + qb) (Mode::classes), from the first column of
// the piece of row at hand: w the class weights (null: 1), q the row's probabilities (null: u_j
// = w_j qb).
template <class T>
struct ClassRow {
  const float* w;
  const T* q;
  float qa, qb;
};
template <class T>
__device__ __forceinline__ ClassRow<T> shifted(ClassRow<T> k, int c) {
  if (k.w) k.w += c;
  if (k.q) k.q += c;
  return k;
}
template <class T, int VW>
__device__ __forceinline__ void class_weights(const ClassRow<T>& k, const tile::Frag<T, VW>& q, int c, float (&u)[VW]) {
#pragma unroll
  for (int i = 0; i < VW; ++i) {
    u[i] = k.q ? fmaf(k.qa, q[i], k.qb) : k.qb;
    if (k.w) u[i] *= __ldg(k.w + c + i);
  }
}

// Pass 1 over columns [0, n) of x, U loads in flight per thread, each VW elements (16 bytes
// when VW > 1) kept packed (tile::Frag) until used: four in flight cost 16 registers rather than
// 32 floats. The loads mark their L2 lines evict-last, so that pass 2 finds them (the row's
// probabilities too, in Mode::classes).
template <class T, int VW, int THREADS, Mode M>
__device__ __forceinline__ AccOf<M> accumulate(const T* x, int n, float cap, const ClassRow<T>& k) {
  constexpr bool kClasses = M == Mode::classes;
  constexpr int U = kUnrollOf<M>;
  const int step = cta_threads<THREADS>() * VW;
  const uint64_t keep = tile::l2_policy<tile::L2Hint::kEvictLast>();
  AccOf<M> acc = empty_acc<M>();
  for (int c0 = int(threadIdx.x) * VW; c0 < n; c0 += U * step) {
    tile::Frag<T, VW> v[U], q[kClasses ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * step >= n) continue;
      v[u] = tile::load_frag_hint<T, VW>(x + c0 + u * step, keep);
      if constexpr (kClasses)
        if (k.q) q[u] = tile::load_frag_hint<T, VW>(k.q + c0 + u * step, keep);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * step >= n) continue;
      float y[VW], w[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) y[i] = capped<M>(v[u][i], cap);
      if constexpr (kClasses) class_weights(k, q[u], c0 + u * step, w);
      add(acc, y, w);
    }
  }
  return acc;
}

// The row's constants once its accumulator is known: loss and lse written (by `writer`), and the
// gradient's factors, d loss / d y_j = p_j coef - flat (times u_j in Mode::classes) - hit [j = t],
// each times the mean's 1 / divisor; under the cap times 1 - tanh^2 as well.
struct RowEnd {
  float lse, coef, flat, hit;
};
struct RowTarget {
  int64_t t;  // -1 for probabilities: no column is the target's
  bool ignored, bad;
};
template <Mode M>
__device__ __forceinline__ RowEnd finish_row(const CeArgs& a, int64_t r, const AccOf<M>& acc, const RowTarget& rt,
                                             float target_logit, bool writer) {
  const float lse = acc.m + logf(acc.s);
  const float scale = rt.ignored ? 0.f : rt.bad ? NAN : a.divisor ? 1.f / *a.divisor : 1.f;
  // The target's class weight, read here rather than with the target: a register less in pass 1.
  const float w = a.weight && rt.t >= 0 && !rt.ignored && !rt.bad ? __ldg(a.weight + rt.t) : 1.f;
  if constexpr (M == Mode::classes) {
    const float h = a.probs ? 0.f : (1.f - a.eps) * w, rw = h + acc.mass;
    if (writer) {
      a.row_loss[r] = rt.ignored ? 0.f : rt.bad ? NAN : rw * (lse + a.z * lse * lse) - h * target_logit - acc.sum;
      if (a.lse) a.lse[r] = lse;
    }
    return {lse, rw * (1.f + 2.f * a.z * lse) * scale, scale, h * scale};
  } else {  // u = e / V for every class; w_t (1 where e > 0) scales the row
    const float inv_v = 1.f / float(a.classes);
    if (writer) {
      // Without smoothing the sum is left out, not multiplied by 0: a logit of -inf (a masked
      // class) makes it -inf, and the loss stays torch's rather than NaN.
      const float smooth = a.eps > 0.f ? a.eps * inv_v * acc.sum : 0.f;
      const float loss = lse - (1.f - a.eps) * target_logit - smooth + a.z * lse * lse;
      a.row_loss[r] = rt.ignored ? 0.f : rt.bad ? NAN : loss * w;
      if (a.lse) a.lse[r] = lse;
    }
    const float s = scale * w;
    return {lse, (1.f + 2.f * a.z * lse) * s, a.eps * inv_v * s, (1.f - a.eps) * s};
  }
}

// Pass 2: the gradient of columns [0, n) from src to g; `col0` is the first column's index in the
// row (for the target's). The row is walked from its end: the columns read last in pass 1 are
// the likeliest to be in L2 still. Its loads mark the lines evict-first (their last use), and the
// gradient is stored streaming (not read here again).
template <class T, int VW, int THREADS, Mode M>
__device__ __forceinline__ void write_grad(const CeArgs& a, const RowEnd& e, const T* src, T* g, int n, int64_t col0,
                                           int64_t t, const ClassRow<T>& k) {
  constexpr bool kClasses = M == Mode::classes;
  constexpr int U = kUnrollOf<M>;
  const int step = cta_threads<THREADS>() * VW, block = U * step;
  const uint64_t last = tile::l2_policy<tile::L2Hint::kEvictFirst>();
  const int tt = t >= col0 && t < col0 + n ? int(t - col0) : -1;  // the target's column here (32-bit)
  const float lse2 = e.lse * kLog2e;
  for (int base = (n - 1) / block * block; base >= 0; base -= block) {
    const int c0 = base + int(threadIdx.x) * VW;
    tile::Frag<T, VW> v[U], q[kClasses ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * step >= n) continue;
      v[u] = tile::load_frag_hint<T, VW>(src + c0 + u * step, last);
      if constexpr (kClasses)
        if (k.q) q[u] = tile::load_frag_hint<T, VW>(k.q + c0 + u * step, last);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (c0 + u * step >= n) continue;
      float out[VW], w[VW];
      if constexpr (kClasses) class_weights(k, q[u], c0 + u * step, w);
#pragma unroll
      for (int i = 0; i < VW; ++i) {
        const float y = capped<M>(v[u][i], a.cap);
        float flat = e.flat;
        if constexpr (kClasses) flat *= w[i];
        const float d = tile::ex2_approx(fmaf(y, kLog2e, -lse2)) * e.coef - flat - (c0 + u * step + i == tt ? e.hit : 0.f);
        out[i] = through_cap<M>(d, y, a.cap);
      }
      tile::store_frag_stream(g + c0 + u * step, tile::pack<T, VW>(out));
    }
  }
}

template <Mode M>
__device__ __forceinline__ RowTarget target_of(const CeArgs& a, int64_t r) {
  if (M == Mode::classes && a.probs) return {-1, false, false};
  const int64_t t = a.target64 ? static_cast<const int64_t*>(a.target)[r] : static_cast<const int32_t*>(a.target)[r];
  const bool ignored = t == a.ignore;
  return {t, ignored, !ignored && (t < 0 || t >= a.classes)};
}

template <class T, Mode M>
__device__ __forceinline__ ClassRow<T> class_row(const CeArgs& a, int64_t r) {
  const float qb = a.eps / float(a.classes);
  if (M != Mode::classes || !a.probs) return {a.weight, nullptr, 0.f, qb};
  return {a.weight, static_cast<const T*>(a.target) + r * a.ts, 1.f - a.eps, qb};
}

// A row of n columns from x as a scalar head up to the first 16-byte boundary, `body` columns of
// 16-byte vectors (VW a load), and a scalar tail: so that any V and row stride (GPT-2's odd
// 50257) stream in 16-byte loads. Without Split (rows aligned, V a multiple of VW): all body.
struct Split {
  int head, body;
};
template <class T, int VW, bool kSplit>
__device__ __forceinline__ Split split_row(const T* x, int n) {
  if constexpr (!kSplit) return {0, n};
  const int head = min(n, int((16 - reinterpret_cast<uintptr_t>(x) % 16) % 16 / sizeof(T)));
  return {head, (n - head) / VW * VW};
}

// The stream tier: a CTA per row at a time (rows blockIdx.x, + gridDim.x, ...), pass 2 reading
// the row again (from L2 where it still is). VW > 1: 16-byte loads, of whole rows, or (kSplit)
// of each row's body, the host having checked that the gradient's rows (and the probabilities')
// lie as the logits' do against 16-byte boundaries. Mode::cap and Mode::classes: THREADS 0, the
// CTA's size a launch argument.
template <class T, int VW, int THREADS, bool kSplit, Mode M>
__global__ void __launch_bounds__(THREADS ? THREADS : kThreads, kThreads / (THREADS ? THREADS : kThreads))
    cross_entropy_kernel(CeArgs a) {
  __shared__ AccOf<M> scratch[32];
  const int V = int(a.classes);  // the host keeps V below 2^31
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(a.logits) + r * a.ls;
    const RowTarget rt = target_of<M>(a, r);
    const ClassRow<T> k = class_row<T, M>(a, r);
    // Read before the merge's barrier: with grad = logits, pass 2 overwrites it.
    const bool writer = threadIdx.x == 0;
    const float xt = writer && rt.t >= 0 && !rt.ignored && !rt.bad ? capped<M>(tile::to_float(x[rt.t]), a.cap) : 0.f;
    const Split sp = split_row<T, VW, kSplit>(x, V);
    const int end = sp.head + sp.body;
    AccOf<M> acc = accumulate<T, VW, THREADS, M>(x + sp.head, sp.body, a.cap, shifted(k, sp.head));
    if constexpr (kSplit) {
      acc = AccMerge{}(acc, accumulate<T, 1, THREADS, M>(x, sp.head, a.cap, k));
      acc = AccMerge{}(acc, accumulate<T, 1, THREADS, M>(x + end, V - end, a.cap, shifted(k, end)));
    }
    acc = tile::block_reduce(acc, AccMerge{}, empty_acc<M>(), scratch);
    const RowEnd e = finish_row<M>(a, r, acc, rt, xt, writer);
    if (!a.grad) continue;
    T* g = static_cast<T*>(a.grad) + r * a.gs;
    if constexpr (kSplit) write_grad<T, 1, THREADS, M>(a, e, x + end, g + end, V - end, end, rt.t, shifted(k, end));
    write_grad<T, VW, THREADS, M>(a, e, x + sp.head, g + sp.head, sp.body, sp.head, rt.t, shifted(k, sp.head));
    if constexpr (kSplit) write_grad<T, 1, THREADS, M>(a, e, x, g, sp.head, 0, rt.t, k);
  }
}

// The per-class kernel (cross_entropy_classes.cu): for every CTA size, as the soft-capped one.
template <class T, int VW, bool kSplit>
void launch_classes(const CeArgs& a, int threads, unsigned grid, cudaStream_t stream);

}  // namespace tessera::ce
