// cross_entropy: the loss of each row of logits against its target class, and the gradient, in
// one kernel (tessera/ops/loss.hpp).
//
// Bytes: the loss needs the logits read once; the gradient, written in the same kernel, one
// write: 2 N V sizeof(T), the floor for training's forward plus backward. A CTA takes a row at a
// time (a persistent grid of one 1024-thread CTA per SM; for short rows smaller CTAs, several per
// SM): pass 1 streams the row into (max, sum of exp, sum) with four 16-byte loads in flight per
// thread, the CTA merges them, and pass 2
// streams the row again, from its end, and writes the gradient. Pass 2 reads the row from L2
// where it is still there: the rows in flight at once (one per SM, 256 KB each at V = 128k in
// bf16) fit in it; pass 1's loads mark their lines evict-last, and pass 2's loads and the
// gradient's stores mark theirs evict-first, so that they do not push out rows still to be read.
//
// Semantics as torch's F.cross_entropy (class indices): ignored rows add 0 and count for nothing
// in the mean; a mean over no rows is NaN. NaN logits give NaN. A target out of range gives NaN
// (torch raises a device-side assertion; a NaN keeps the call free of synchronization).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "ops/loss/reduce.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/loss.hpp"
#include "tile/activation.cuh"
#include "tile/constants.cuh"
#include "tile/convert.cuh"
#include "tile/frag.cuh"
#include "tile/online_softmax.cuh"
#include "tile/reduce.cuh"
#include "tile/vec.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

constexpr const char* kOp = "cross_entropy";
constexpr int kThreads = 1024;  // a long row's CTA; shorter rows take fewer (RowTier::plan)
constexpr int kScaleThreads = 512;
constexpr int kUnroll = 4;  // 16-byte loads in flight per thread

struct CeArgs {
  const void* logits;
  void* grad;  // null: not written
  int64_t ls, gs;  // row strides, elements
  const void* target;
  bool target64;
  int64_t rows, classes, ignore;
  float eps, z, cap;  // label smoothing, z-loss, soft-cap (0: none)
  float* row_loss;    // [rows]: the output (none) or scratch (mean, sum)
  float* lse;         // nullable
  const int* valid;   // mean: the rows not ignored (device); else null
};

// Per-thread, then per-row, accumulator: the online max and sum of exp, and the sum of logits.
struct Acc {
  float m, s, sum;
};
struct AccMerge {
  __device__ Acc operator()(Acc a, Acc b) const {
    const tile::SoftmaxState e = tile::SoftmaxMerge{}({a.m, a.s}, {b.m, b.s});
    return {e.m, e.s, a.sum + b.sum};
  }
};

// The logit as the loss sees it: soft-capped (cap tanh(x / cap)) in the kernels for a cap > 0,
// as it is in the others.
template <bool kCap>
__device__ __forceinline__ float capped(float x, float cap) { return kCap ? cap * tanhf(x / cap) : x; }

using tile::kLog2e;

// The CTA's threads: THREADS, or where that is 0 (the soft-capped kernel), the launch's.
template <int THREADS>
__device__ __forceinline__ int cta_threads() { return THREADS ? THREADS : int(blockDim.x); }

// Adds one vector of (capped) logits: its max first, one rescale test per vector rather than per
// element, then each exp as one FFMA and one MUFU ex2 (in log2 units against the running max).
template <int VW>
__device__ __forceinline__ void add(Acc& a, const float (&y)[VW]) {
  float mv = y[0];
#pragma unroll
  for (int i = 1; i < VW; ++i) mv = fmaxf(mv, y[i]);
#pragma unroll
  for (int i = 0; i < VW; ++i) a.sum += y[i];
  if (mv > a.m) a.s *= tile::ex2_approx((a.m - mv) * kLog2e), a.m = mv;  // a.m = -inf: the sum so far is 0
  if (a.m == -INFINITY) return;  // nothing but -inf so far: adds 0 (a NaN still reaches the sum)
  const float m2 = a.m * kLog2e;
#pragma unroll
  for (int i = 0; i < VW; ++i) a.s += tile::ex2_approx(fmaf(y[i], kLog2e, -m2));
}

// The row's constants once its (max, sum of exp, sum) is known: loss and lse written (by
// `writer`), and the gradient's factors: d loss / d y_j = p_j (1 + 2 z lse) - e / V - (1 - e)
// [j = t], times the mean's 1 / valid; under the cap times 1 - tanh^2 as well.
struct RowEnd {
  float lse, coef, flat, hit;
};
__device__ __forceinline__ RowEnd finish_row(const CeArgs& a, int64_t r, const Acc& acc, bool ignored, bool bad,
                                             float target_logit, bool writer) {
  const float inv_v = 1.f / float(a.classes), lse = acc.m + logf(acc.s);
  if (writer) {
    const float loss = lse - (1.f - a.eps) * target_logit - a.eps * inv_v * acc.sum + a.z * lse * lse;
    a.row_loss[r] = ignored ? 0.f : bad ? NAN : loss;
    if (a.lse) a.lse[r] = lse;
  }
  const float scale = ignored ? 0.f : bad ? NAN : a.valid ? 1.f / float(*a.valid) : 1.f;
  return {lse, (1.f + 2.f * a.z * lse) * scale, a.eps * inv_v * scale, (1.f - a.eps) * scale};
}

// Pass 1 over columns [0, n) of x (global memory or a staged chunk), kUnroll loads in flight per
// thread, each VW elements (16 bytes when VW > 1) kept packed (tile::Frag) until used: four in
// flight cost 16 registers rather than 32 floats. The loads mark their L2 lines evict-last, so
// that pass 2 finds them.
template <class T, int VW, int THREADS, bool kCap>
__device__ __forceinline__ Acc accumulate(const T* x, int n, float cap) {
  const int step = cta_threads<THREADS>() * VW;
  const uint64_t keep = tile::l2_policy<tile::L2Hint::kEvictLast>();
  Acc acc{-INFINITY, 0.f, 0.f};
  for (int c0 = int(threadIdx.x) * VW; c0 < n; c0 += kUnroll * step) {
    tile::Frag<T, VW> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * step < n) v[u] = tile::load_frag_hint<T, VW>(x + c0 + u * step, keep);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u * step >= n) continue;
      float y[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) y[i] = capped<kCap>(v[u][i], cap);
      add(acc, y);
    }
  }
  return acc;
}

// Pass 2: the gradient of columns [0, n) from src to g; `col0` is the first column's index in the
// row (for the target's). The row is walked from its end: the columns read last in pass 1 are
// the likeliest to be in L2 still. Its loads mark the lines evict-first (their last use), and the
// gradient is stored streaming (not read here again).
template <class T, int VW, int THREADS, bool kCap>
__device__ __forceinline__ void write_grad(const CeArgs& a, const RowEnd& e, const T* src, T* g, int n, int64_t col0,
                                           int64_t t) {
  const int step = cta_threads<THREADS>() * VW, block = kUnroll * step;
  const uint64_t last = tile::l2_policy<tile::L2Hint::kEvictFirst>();
  const int tt = t >= col0 && t < col0 + n ? int(t - col0) : -1;  // the target's column here (32-bit)
  const float lse2 = e.lse * kLog2e;
  for (int base = (n - 1) / block * block; base >= 0; base -= block) {
    const int c0 = base + int(threadIdx.x) * VW;
    tile::Frag<T, VW> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * step < n) v[u] = tile::load_frag_hint<T, VW>(src + c0 + u * step, last);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (c0 + u * step >= n) continue;
      float out[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) {
        const float y = capped<kCap>(v[u][i], a.cap);
        float d = tile::ex2_approx(fmaf(y, kLog2e, -lse2)) * e.coef - e.flat - (c0 + u * step + i == tt ? e.hit : 0.f);
        if constexpr (kCap) d *= 1.f - (y / a.cap) * (y / a.cap);
        out[i] = d;
      }
      tile::store_frag_stream(g + c0 + u * step, tile::pack<T, VW>(out));
    }
  }
}

struct RowTarget {
  int64_t t;
  bool ignored, bad;
};
__device__ __forceinline__ RowTarget target_of(const CeArgs& a, int64_t r) {
  const int64_t t = a.target64 ? static_cast<const int64_t*>(a.target)[r] : static_cast<const int32_t*>(a.target)[r];
  const bool ignored = t == a.ignore;
  return {t, ignored, !ignored && (t < 0 || t >= a.classes)};
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
// of each row's body, the host having checked that the gradient's rows lie as the logits' do
// against 16-byte boundaries. kCap: the logits soft-capped (launch_sized), THREADS then 0.
template <class T, int VW, int THREADS, bool kSplit, bool kCap>
__global__ void __launch_bounds__(THREADS ? THREADS : kThreads, kThreads / (THREADS ? THREADS : kThreads))
    cross_entropy_kernel(CeArgs a) {
  __shared__ Acc scratch[32];
  const int V = int(a.classes);  // the host keeps V below 2^31
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const T* x = static_cast<const T*>(a.logits) + r * a.ls;
    const RowTarget rt = target_of(a, r);
    // Read before the merge's barrier: with grad = logits, pass 2 overwrites it.
    const bool writer = threadIdx.x == 0;
    const float xt = writer && !rt.ignored && !rt.bad ? capped<kCap>(tile::to_float(x[rt.t]), a.cap) : 0.f;
    const Split sp = split_row<T, VW, kSplit>(x, V);
    const int end = sp.head + sp.body;
    Acc acc = accumulate<T, VW, THREADS, kCap>(x + sp.head, sp.body, a.cap);
    if constexpr (kSplit) {
      acc = AccMerge{}(acc, accumulate<T, 1, THREADS, kCap>(x, sp.head, a.cap));
      acc = AccMerge{}(acc, accumulate<T, 1, THREADS, kCap>(x + end, V - end, a.cap));
    }
    acc = tile::block_reduce(acc, AccMerge{}, Acc{-INFINITY, 0.f, 0.f}, scratch);
    const RowEnd e = finish_row(a, r, acc, rt.ignored, rt.bad, xt, writer);
    if (!a.grad) continue;
    T* g = static_cast<T*>(a.grad) + r * a.gs;
    if constexpr (kSplit) write_grad<T, 1, THREADS, kCap>(a, e, x + end, g + end, V - end, end, rt.t);
    write_grad<T, VW, THREADS, kCap>(a, e, x + sp.head, g + sp.head, sp.body, sp.head, rt.t);
    if constexpr (kSplit) write_grad<T, 1, THREADS, kCap>(a, e, x, g, sp.head, 0, rt.t);
  }
}

// The rows not ignored, for the mean.
__global__ void __launch_bounds__(1024) count_kernel(const void* target, bool target64, int64_t rows, int64_t ignore,
                                                     int* valid) {
  __shared__ int scratch[32];
  int n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const int64_t t = target64 ? static_cast<const int64_t*>(target)[r] : static_cast<const int32_t*>(target)[r];
    n += t != ignore;
  }
  n = tile::block_sum(n, scratch);
  if (threadIdx.x == 0) *valid = n;
}

// The per-row losses summed in a fixed order (the same bits every run); the mean divides by the
// rows not ignored (none: 0 / 0 = NaN, as torch).
__global__ void __launch_bounds__(1024) reduce_kernel(const float* row_loss, int64_t rows, const int* valid, float* loss) {
  __shared__ float scratch[32];
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
  s = tile::block_sum(s, scratch);
  if (threadIdx.x == 0) *loss = valid ? s / float(*valid) : s;
}

// Row r of grad times its factor (grad_loss[0], or grad_loss[r * stride] for none); a factor of
// exactly 1 leaves the row unread.
template <class T, int VW>
__global__ void __launch_bounds__(kScaleThreads) scale_kernel(const float* grad_loss, int64_t stride, T* grad, int64_t gs,
                                                         int64_t rows, int classes) {
  const int step = kScaleThreads * VW;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float f = grad_loss[r * stride];
    if (f == 1.f) continue;
    const uint64_t policy = tile::l2_policy<tile::L2Hint::kEvictFirst>();
    T* g = grad + r * gs;
    for (int c = int(threadIdx.x) * VW; c < classes; c += step) {
      const tile::Frag<T, VW> v = tile::load_frag_hint<T, VW>(g + c, policy);
      float out[VW];
#pragma unroll
      for (int i = 0; i < VW; ++i) out[i] = v[i] * f;
      tile::store_frag_stream(g + c, tile::pack<T, VW>(out));
    }
  }
}

// Soft-capped logits (a cap > 0, a rare option) take one kernel for every CTA size, its size a
// launch argument: the tanh of every element makes a kernel several times larger, and a copy of it
// per CTA size, or beside the uncapped loops in every kernel, costs compile time for nothing.
template <class T, int VW, bool kSplit>
void launch_sized(const CeArgs& a, int threads, unsigned grid, cudaStream_t stream) {
  if (a.cap > 0.f) return cross_entropy_kernel<T, VW, 0, kSplit, true><<<grid, threads, 0, stream>>>(a);
  switch (threads) {
    case 128: return cross_entropy_kernel<T, VW, 128, kSplit, false><<<grid, 128, 0, stream>>>(a);
    case 256: return cross_entropy_kernel<T, VW, 256, kSplit, false><<<grid, 256, 0, stream>>>(a);
    case 512: return cross_entropy_kernel<T, VW, 512, kSplit, false><<<grid, 512, 0, stream>>>(a);
    default: return cross_entropy_kernel<T, VW, kThreads, kSplit, false><<<grid, kThreads, 0, stream>>>(a);
  }
}

// Calls f(T{}) for the element type of `dtype` (float32, float16 or bfloat16).
template <class F>
void with_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::float16: return f(__half{});
    default: return f(__nv_bfloat16{});
  }
}

// ---- host: the tiers (runtime/tier.hpp) ---------------------------------------------------------
// One kernel, three ways of reading a row: 16-byte vectors of whole rows, 16-byte vectors between
// a scalar head and tail (rows at any alignment), or element by element.
enum class Access { scalar, vectors, split };

// One call as the tiers see it: the kernel arguments and the layout facts they choose by.
struct Call {
  CeArgs a;
  DType dtype;
  bool same_alignment;  // the gradient's rows lie as the logits' do against 16-byte boundaries
  bool vectorizable;    // every row of logits (and grad) 16-byte aligned, V a multiple of the vector
};

struct RowsPlan {
  int threads = 0, vw = 1;
  unsigned grid = 0;
  std::string describe() const {
    return std::to_string(grid) + " persistent CTAs of " + std::to_string(threads) + " threads, " +
           std::to_string(vw) + " elements a load";
  }
};

// A 1024-thread CTA per SM for long rows: the rows in flight at once (one per SM, 256 KB each at
// V = 128k in bf16) fit in L2, so pass 2 finds its row there. A row that fewer threads cover in
// one step of kUnroll loads each takes that many (128 at least), with 1024 / threads CTAs per SM,
// so an SM keeps as many rows in flight rather than one mostly idle CTA.
template <Access A>
struct RowTier {
  static constexpr const char* kName = A == Access::vectors ? "vectors" : A == Access::split ? "split" : "scalar";
  static constexpr const char* kWhen =
      A == Access::vectors ? "rows 16-byte aligned, V a multiple of the vector: a CTA per row, 16-byte loads"
      : A == Access::split ? "the gradient's rows at the logits' offsets from 16-byte boundaries: a CTA per row, "
                             "16-byte loads between a scalar head and tail"
                           : "any rows: a CTA per row, element loads";
  static bool can_implement(const Call& c, const cudaDeviceProp&) {
    if constexpr (A == Access::vectors) return c.same_alignment && c.vectorizable;
    else if constexpr (A == Access::split) return c.same_alignment;
    else return true;
  }
  static RowsPlan plan(const Call& c, const cudaDeviceProp& prop) {
    RowsPlan p;
    p.vw = A == Access::scalar ? 1 : 16 / int(dtype_size(c.dtype));
    p.threads = 128;
    while (p.threads < kThreads && int64_t(p.threads) * kUnroll * p.vw < c.a.classes) p.threads *= 2;
    const int64_t sms = prop.multiProcessorCount;
    p.grid = runtime::grid_cap(std::min<int64_t>(c.a.rows, sms * (kThreads / p.threads)));
    return p;
  }
  static void launch(const Call& c, const RowsPlan& p, cudaStream_t stream) {
    with_dtype(c.dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (A == Access::scalar) launch_sized<T, 1, false>(c.a, p.threads, p.grid, stream);
      else launch_sized<T, 16 / sizeof(T), A == Access::split>(c.a, p.threads, p.grid, stream);
    });
    TESSERA_LAUNCH_CHECK();
  }
};

// The stream tier's 16-byte loads: rows in any alignment, so long as the gradient's lie as the
// logits' do (the same view, or the same offsets from 16-byte boundaries row by row).
bool same_alignment(const TensorView& logits, const TensorView* grad) {
  if (!grad) return true;
  const int64_t e = int64_t(dtype_size(logits.dtype));
  const auto offset = [](const TensorView& t) { return reinterpret_cast<uintptr_t>(t.data) % 16; };
  return offset(logits) == offset(*grad) &&
         (logits.shape[0] <= 1 || (logits.strides[0] * e) % 16 == (grad->strides[0] * e) % 16);
}

// 16-byte accesses where every row starts 16-byte aligned and the classes fill the vectors.
bool vectorizable(const TensorView& t) {
  const int64_t vw = 16 / int64_t(dtype_size(t.dtype));
  return t.shape[1] % vw == 0 && reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && (t.shape[0] <= 1 || t.strides[0] % vw == 0);
}

// cross_entropy_backward: rows of grad scaled in place, 16 bytes or an element a load.
struct ScaleCall {
  const float* factor;
  int64_t factor_stride;  // 0: one factor for every row
  void* grad;
  int64_t gs, rows;
  int classes;
  DType dtype;
  bool vectorizable;
};

struct ScalePlan {
  unsigned grid = 0;
  std::string describe() const {
    return std::to_string(grid) + " persistent CTAs of " + std::to_string(kScaleThreads) + " threads";
  }
};

template <bool kVec>
struct ScaleTier {
  static constexpr const char* kName = kVec ? "vectors" : "scalar";
  static constexpr const char* kWhen =
      kVec ? "rows 16-byte aligned, V a multiple of the vector: 16-byte accesses" : "any rows: element accesses";
  static bool can_implement(const ScaleCall& c, const cudaDeviceProp&) { return !kVec || c.vectorizable; }
  // Two CTAs per SM, each a row at a time.
  static ScalePlan plan(const ScaleCall& c, const cudaDeviceProp& prop) {
    return {runtime::grid_cap(std::min<int64_t>(c.rows, 2LL * prop.multiProcessorCount))};
  }
  static void launch(const ScaleCall& c, const ScalePlan& p, cudaStream_t stream) {
    with_dtype(c.dtype, [&](auto t) {
      using T = decltype(t);
      scale_kernel<T, kVec ? 16 / sizeof(T) : 1><<<p.grid, kScaleThreads, 0, stream>>>(
          c.factor, c.factor_stride, static_cast<T*>(c.grad), c.gs, c.rows, c.classes);
    });
    TESSERA_LAUNCH_CHECK();
  }
};

void check(const TensorView& logits, const TensorView& target, const TensorView& loss, const TensorView* lse,
           const TensorView* grad, const CrossEntropyOptions& o) {
  detail::check_cuda_tensor(kOp, "logits", logits);
  detail::check_dtype_in(kOp, "logits", logits, {DType::float32, DType::float16, DType::bfloat16});
  if (logits.ndim != 2 || logits.shape[1] < 1 || logits.shape[1] > INT32_MAX - 65536 ||
      (logits.strides[1] != 1 && logits.shape[1] > 1))
    detail::throw_arg(ErrorKind::value, kOp, "logits",
                      "a 2-d tensor [N, V] with 1 <= V < 2^31 - 2^16 and the class dimension contiguous",
                      std::to_string(logits.ndim) + "-d" +
                          (logits.ndim == 2 ? " [" + std::to_string(logits.shape[0]) + ", " +
                                                  std::to_string(logits.shape[1]) + "], class stride " +
                                                  std::to_string(logits.strides[1])
                                            : std::string()));
  detail::check_cuda_tensor(kOp, "target", target);
  detail::check_dtype_in(kOp, "target", target, {DType::int64, DType::int32});
  detail::check_same_device(kOp, "target", target, "logits", logits);
  if (target.ndim != 1 || target.shape[0] != logits.shape[0] || (target.strides[0] != 1 && target.shape[0] > 1))
    detail::throw_arg(ErrorKind::value, kOp, "target",
                      "a contiguous 1-d tensor of logits' N = " + std::to_string(logits.shape[0]) + " class indices",
                      std::to_string(target.ndim) + "-d" + (target.ndim == 1 ? " of " + std::to_string(target.shape[0]) : std::string()));
  detail::check_cuda_tensor(kOp, "loss", loss);
  detail::check_dtype_in(kOp, "loss", loss, {DType::float32});
  detail::check_same_device(kOp, "loss", loss, "logits", logits);
  const bool none = o.reduction == Reduction::none;
  if (none ? (loss.ndim != 1 || loss.shape[0] != logits.shape[0] || (loss.strides[0] != 1 && loss.shape[0] > 1))
           : loss.ndim != 0)
    detail::throw_arg(ErrorKind::value, kOp, "loss",
                      none ? "a contiguous 1-d float32 tensor of N = " + std::to_string(logits.shape[0]) + " (reduction none)"
                           : std::string("a 0-d float32 tensor (reduction mean or sum)"),
                      std::to_string(loss.ndim) + "-d");
  if (lse) {
    detail::check_cuda_tensor(kOp, "lse", *lse);
    detail::check_dtype_in(kOp, "lse", *lse, {DType::float32});
    detail::check_same_device(kOp, "lse", *lse, "logits", logits);
    if (lse->ndim != 1 || lse->shape[0] != logits.shape[0] || (lse->strides[0] != 1 && lse->shape[0] > 1))
      detail::throw_arg(ErrorKind::value, kOp, "lse", "a contiguous 1-d float32 tensor of N = " + std::to_string(logits.shape[0]),
                        std::to_string(lse->ndim) + "-d");
  }
  if (grad) {
    detail::check_like(kOp, "grad", *grad, "logits", logits);
    if (grad->strides[1] != 1 && grad->shape[1] > 1)
      detail::throw_arg(ErrorKind::value, kOp, "grad", "the class dimension contiguous",
                        "class stride " + std::to_string(grad->strides[1]));
    detail::check_no_internal_overlap(kOp, "grad", *grad);
    detail::check_no_overlap(kOp, "grad", *grad, "logits", logits, true);
    detail::check_no_overlap(kOp, "grad", *grad, "target", target, false);
    detail::check_no_overlap(kOp, "grad", *grad, "loss", loss, false);
  }
  detail::check_no_overlap(kOp, "loss", loss, "logits", logits, false);
  if (!(o.label_smoothing >= 0.0 && o.label_smoothing <= 1.0))
    detail::throw_arg(ErrorKind::value, kOp, "label_smoothing", "a number in [0, 1]", std::to_string(o.label_smoothing));
  if (!(o.z_loss >= 0.0) || !std::isfinite(o.z_loss))
    detail::throw_arg(ErrorKind::value, kOp, "z_loss", "a finite number >= 0", std::to_string(o.z_loss));
  if (!(o.softcap >= 0.0) || !std::isfinite(o.softcap))
    detail::throw_arg(ErrorKind::value, kOp, "softcap", "a finite number >= 0 (0: none)", std::to_string(o.softcap));
}

}  // namespace

void cross_entropy(const TensorView& logits, const TensorView& target, const TensorView& loss, const TensorView* lse,
                   const TensorView* grad, const CrossEntropyOptions& options, cudaStream_t stream) {
  check(logits, target, loss, lse, grad, options);
  runtime::DeviceGuard guard(logits.device.index);
  const int64_t rows = logits.shape[0];
  const bool none = options.reduction == Reduction::none, mean = options.reduction == Reduction::mean;
  if (none && rows == 0) return;
  CeArgs a{};
  a.logits = logits.data, a.grad = grad ? grad->data : nullptr;
  a.ls = logits.strides[0], a.gs = grad ? grad->strides[0] : 0;
  a.target = target.data, a.target64 = target.dtype == DType::int64;
  a.rows = rows, a.classes = logits.shape[1], a.ignore = options.ignore_index;
  a.eps = float(options.label_smoothing), a.z = float(options.z_loss), a.cap = float(options.softcap);
  a.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  runtime::Scratch row_loss(none ? 0 : size_t(std::max<int64_t>(rows, 1)) * sizeof(float), stream),
      valid(mean ? sizeof(int) : 0, stream);
  a.row_loss = none ? static_cast<float*>(loss.data) : row_loss.as<float>();
  a.valid = mean ? valid.as<int>() : nullptr;
  if (mean) {
    loss::count_valid(a.target, a.target64, rows, a.ignore, valid.as<int>(), stream);
  }
  if (rows > 0) {
    const Call c{a, logits.dtype, same_alignment(logits, grad), vectorizable(logits) && (!grad || vectorizable(*grad))};
    runtime::run_first<RowTier<Access::vectors>, RowTier<Access::split>, RowTier<Access::scalar>>(
        kOp, c, runtime::device_props(logits.device.index), stream);
  }
  if (!none) {
    loss::sum_rows(a.row_loss, rows, a.valid, static_cast<float*>(loss.data), stream);
  }
}

void loss::count_valid(const void* target, bool target64, int64_t rows, int64_t ignore, int* valid,
                       cudaStream_t stream) {
  count_kernel<<<1, 1024, 0, stream>>>(target, target64, rows, ignore, valid);
  TESSERA_LAUNCH_CHECK();
}

void loss::sum_rows(const float* row_loss, int64_t rows, const int* valid, float* loss, cudaStream_t stream) {
  reduce_kernel<<<1, 1024, 0, stream>>>(row_loss, rows, valid, loss);
  TESSERA_LAUNCH_CHECK();
}

void cross_entropy_backward(const TensorView& grad_loss, const TensorView& grad, Reduction reduction,
                            cudaStream_t stream) {
  constexpr const char* op = "cross_entropy_backward";
  detail::check_cuda_tensor(op, "grad", grad);
  detail::check_dtype_in(op, "grad", grad, {DType::float32, DType::float16, DType::bfloat16});
  if (grad.ndim != 2 || grad.shape[1] > INT32_MAX - 65536 || (grad.strides[1] != 1 && grad.shape[1] > 1))
    detail::throw_arg(ErrorKind::value, op, "grad", "a 2-d tensor [N, V] with the class dimension contiguous",
                      std::to_string(grad.ndim) + "-d");
  detail::check_no_internal_overlap(op, "grad", grad);
  detail::check_cuda_tensor(op, "grad_loss", grad_loss);
  detail::check_dtype_in(op, "grad_loss", grad_loss, {DType::float32});
  detail::check_same_device(op, "grad_loss", grad_loss, "grad", grad);
  const bool none = reduction == Reduction::none;
  if (none ? grad_loss.ndim != 1 || grad_loss.shape[0] != grad.shape[0] : grad_loss.ndim != 0)
    detail::throw_arg(ErrorKind::value, op, "grad_loss",
                      none ? "a 1-d tensor of grad's N = " + std::to_string(grad.shape[0]) + " (reduction none)"
                           : std::string("a 0-d tensor (reduction mean or sum)"),
                      std::to_string(grad_loss.ndim) + "-d");
  detail::check_no_overlap(op, "grad", grad, "grad_loss", grad_loss, false);
  const int64_t rows = grad.shape[0];
  if (rows == 0 || grad.shape[1] == 0) return;
  runtime::DeviceGuard guard(grad.device.index);
  const ScaleCall c{static_cast<const float*>(grad_loss.data), none ? grad_loss.strides[0] : 0, grad.data,
                    grad.strides[0], rows, int(grad.shape[1]), grad.dtype, vectorizable(grad)};
  runtime::run_first<ScaleTier<true>, ScaleTier<false>>(op, c, runtime::device_props(grad.device.index), stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// The loss, lse and gradient outputs shaped by the reduction: torch kernels written by hand
// (python/src/torch/loss.cpp).
const OpRegistrar kCrossEntropy = describe("cross_entropy", "loss", "cross-entropy of logits [N, V] against class targets, with the gradient in the same pass")
    .schema("cross_entropy(Tensor logits, Tensor target, *, int ignore_index=-100, str reduction=\"mean\", "
            "float label_smoothing=0.0, float z_loss=0.0, float softcap=0.0, bool with_grad=False) -> (Tensor, Tensor, Tensor)")
    .schema("cross_entropy.inplace(Tensor(a!) logits, Tensor target, *, int ignore_index=-100, str reduction=\"mean\", "
            "float label_smoothing=0.0, float z_loss=0.0, float softcap=0.0) -> (Tensor, Tensor)")
    .schema("cross_entropy.backward(Tensor grad_loss, Tensor(a!) grad, *, str reduction=\"mean\") -> ()")
    .torch("torch.nn.functional.cross_entropy");
}  // namespace
}  // namespace tessera
