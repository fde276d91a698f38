// cross_entropy: the loss of each row of logits against its target (class indices or class
// probabilities), and the gradient, in one kernel (tessera/ops/loss.hpp). The kernel, its passes
// and what bounds them are in cross_entropy.cuh; here the host side: checks, the tiers, the
// mean's divisor and sum, and the backward's scaling.
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
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/loss.hpp"
#include "tile/frag.cuh"
#include "tile/reduce.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

using ce::CeArgs;
using ce::Mode;
using ce::cross_entropy_kernel;
using ce::kThreads;
using ce::kUnroll;

constexpr const char* kOp = "cross_entropy";
constexpr int kScaleThreads = 512;

// A mean's divisor: for class indices the rows not ignored, or with class weights the sum of
// their targets' weights (a target out of range adds nothing: its row's NaN is the mean's
// already, and the other rows' gradients stay finite, as they do without weights); for
// probabilities (target null) the rows. Computed by a whole block; every thread gets it.
struct MeanOf {
  const void* target;
  bool target64;
  int64_t rows, ignore;
  const float* weight;
  int64_t classes;

  __device__ float block_divisor() const {
    __shared__ float wscratch[32];
    __shared__ int nscratch[32];
    if (!target) return float(rows);
    int n = 0;
    float w = 0.f;
    for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      const int64_t t = target64 ? static_cast<const int64_t*>(target)[r] : static_cast<const int32_t*>(target)[r];
      n += t != ignore;
      if (weight && t != ignore && t >= 0 && t < classes) w += weight[t];
    }
    return weight ? tile::block_sum(w, wscratch) : float(tile::block_sum(n, nscratch));
  }
};

__global__ void __launch_bounds__(1024) divisor_kernel(const MeanOf mean, float* divisor) {
  const float d = mean.block_divisor();
  if (threadIdx.x == 0) *divisor = d;
}

// The per-row losses summed in a fixed order (the same bits every run); a mean divides by
// *divisor, or where the forward computed none (no gradient needed it first) by `mean`'s, computed
// here: one launch less. No rows, or only ignored ones: 0 / 0 = NaN, as torch.
__global__ void __launch_bounds__(1024) reduce_kernel(const float* row_loss, int64_t rows, const float* divisor,
                                                      const MeanOf mean, bool own_mean, float* loss) {
  __shared__ float scratch[32];
  float s = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) s += row_loss[r];
  s = tile::block_sum(s, scratch);
  const float d = own_mean ? mean.block_divisor() : divisor ? *divisor : 1.f;
  if (threadIdx.x == 0) *loss = own_mean || divisor ? s / d : s;
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
// per CTA size, or beside the uncapped loops in every kernel, costs compile time for nothing. The
// per-class mode (probabilities, or class weights with smoothing) likewise.
template <class T, int VW, bool kSplit>
void launch_sized(const CeArgs& a, bool classes, int threads, unsigned grid, cudaStream_t stream) {
  if (classes) return ce::launch_classes<T, VW, kSplit>(a, threads, grid, stream);
  if (a.cap > 0.f) return cross_entropy_kernel<T, VW, 0, kSplit, Mode::cap><<<grid, threads, 0, stream>>>(a);
  switch (threads) {
    case 128: return cross_entropy_kernel<T, VW, 128, kSplit, Mode::plain><<<grid, 128, 0, stream>>>(a);
    case 256: return cross_entropy_kernel<T, VW, 256, kSplit, Mode::plain><<<grid, 256, 0, stream>>>(a);
    case 512: return cross_entropy_kernel<T, VW, 512, kSplit, Mode::plain><<<grid, 512, 0, stream>>>(a);
    default: return cross_entropy_kernel<T, VW, kThreads, kSplit, Mode::plain><<<grid, kThreads, 0, stream>>>(a);
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
// One kernel, three ways of reading a row (loss::Access).
using loss::Access;
using loss::RowsPlan;

// One call as the tiers see it: the kernel arguments and the layout facts they choose by.
struct Call {
  CeArgs a;
  DType dtype;
  bool classes;         // Mode::classes: per-class weights u_j (cross_entropy.cuh)
  bool same_alignment;  // the gradient's (and probabilities') rows lie as the logits' do against 16-byte boundaries
  bool vectorizable;    // every row of logits (grad, probabilities) 16-byte aligned, V a multiple of the vector
};

// A 1024-thread CTA per SM for long rows (loss::rows_plan, kUnroll loads in flight): the rows in
// flight at once (one per SM, 256 KB each at V = 128k in bf16) fit in L2, so pass 2 finds its row
// there.
template <Access A>
struct RowTier {
  static constexpr const char* kName = A == Access::vectors ? "vectors" : A == Access::split ? "split" : "scalar";
  static constexpr const char* kWhen =
      A == Access::vectors ? "rows 16-byte aligned, V a multiple of the vector: a CTA per row, 16-byte loads"
      : A == Access::split ? "the gradient's (probabilities') rows at the logits' offsets from 16-byte boundaries: "
                             "a CTA per row, "
                             "16-byte loads between a scalar head and tail"
                           : "any rows: a CTA per row, element loads";
  static bool can_implement(const Call& c, const cudaDeviceProp&) {
    if constexpr (A == Access::vectors) return c.same_alignment && c.vectorizable;
    else if constexpr (A == Access::split) return c.same_alignment;
    else return true;
  }
  static RowsPlan plan(const Call& c, const cudaDeviceProp& prop) {
    return loss::rows_plan(c.a.rows, c.a.classes, A == Access::scalar ? 1 : 16 / int(dtype_size(c.dtype)),
                           c.classes ? ce::kUnrollOf<Mode::classes> : kUnroll, kThreads, prop.multiProcessorCount);
  }
  static void launch(const Call& c, const RowsPlan& p, cudaStream_t stream) {
    with_dtype(c.dtype, [&](auto t) {
      using T = decltype(t);
      if constexpr (A == Access::scalar) launch_sized<T, 1, false>(c.a, c.classes, p.threads, p.grid, stream);
      else launch_sized<T, 16 / sizeof(T), A == Access::split>(c.a, c.classes, p.threads, p.grid, stream);
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

// target as class indices [N] (int64, int32) or, where it has the logits' rank, as probabilities
// of their shape and dtype; torch's rule for the latter: ignore_index negative.
void check_target(const TensorView& logits, const TensorView& target, const CrossEntropyOptions& o) {
  detail::check_cuda_tensor(kOp, "target", target);
  const std::string n = std::to_string(logits.shape[0]);
  if (target.ndim == 2) {
    if (target.dtype != logits.dtype)
      detail::throw_arg(ErrorKind::type, kOp, "target",
                        std::string("class probabilities of the logits' dtype ") + dtype_name(logits.dtype) +
                            " (a target of the logits' shape)",
                        dtype_name(target.dtype));
    detail::check_same_device(kOp, "target", target, "logits", logits);
    if (target.shape[0] != logits.shape[0] || target.shape[1] != logits.shape[1] ||
        (target.strides[1] != 1 && target.shape[1] > 1))
      detail::throw_arg(ErrorKind::value, kOp, "target",
                        "class probabilities of the logits' shape [" + n + ", " + std::to_string(logits.shape[1]) +
                            "], the class dimension contiguous",
                        detail::dims(target) + ", class stride " + std::to_string(target.strides[1]));
    if (o.ignore_index >= 0)
      detail::throw_arg(ErrorKind::value, kOp, "ignore_index",
                        "a negative number with class probabilities as target (torch's rule: none is ignored)",
                        std::to_string(o.ignore_index));
    return;
  }
  detail::check_dtype_in(kOp, "target", target, {DType::int64, DType::int32});
  detail::check_same_device(kOp, "target", target, "logits", logits);
  if (target.ndim != 1 || target.shape[0] != logits.shape[0] || (target.strides[0] != 1 && target.shape[0] > 1))
    detail::throw_arg(ErrorKind::value, kOp, "target",
                      "a contiguous 1-d tensor of logits' N = " + n + " class indices (or class probabilities of "
                      "the logits' shape)",
                      std::to_string(target.ndim) + "-d" + (target.ndim == 1 ? " of " + std::to_string(target.shape[0]) : std::string()));
}

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
  check_target(logits, target, o);
  if (const TensorView* w = o.weight) {
    detail::check_cuda_tensor(kOp, "weight", *w);
    detail::check_dtype_in(kOp, "weight", *w, {DType::float32});
    detail::check_same_device(kOp, "weight", *w, "logits", logits);
    if (w->ndim != 1 || w->shape[0] != logits.shape[1] || (w->strides[0] != 1 && w->shape[0] > 1))
      detail::throw_arg(ErrorKind::value, kOp, "weight",
                        "a contiguous 1-d float32 tensor of V = " + std::to_string(logits.shape[1]) + " class weights",
                        detail::dims(*w) + (w->ndim == 1 ? ", stride " + std::to_string(w->strides[0]) : std::string()));
  }
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
    if (o.weight) detail::check_no_overlap(kOp, "grad", *grad, "weight", *o.weight, false);
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
  const bool probs = target.ndim == 2;
  if (none && rows == 0) return;
  CeArgs a{};
  a.logits = logits.data, a.grad = grad ? grad->data : nullptr;
  a.ls = logits.strides[0], a.gs = grad ? grad->strides[0] : 0;
  a.target = target.data, a.target64 = target.dtype == DType::int64;
  a.probs = probs, a.ts = probs ? target.strides[0] : 0;
  a.rows = rows, a.classes = logits.shape[1], a.ignore = options.ignore_index;
  a.eps = float(options.label_smoothing), a.z = float(options.z_loss), a.cap = float(options.softcap);
  a.weight = options.weight ? static_cast<const float*>(options.weight->data) : nullptr;
  a.lse = lse ? static_cast<float*>(lse->data) : nullptr;
  // The gradient needs the mean's divisor first; the loss alone takes it in its sum.
  const bool divisor_first = mean && grad;
  runtime::Scratch row_loss(none ? 0 : size_t(std::max<int64_t>(rows, 1)) * sizeof(float), stream),
      divisor(divisor_first ? sizeof(float) : 0, stream);
  a.row_loss = none ? static_cast<float*>(loss.data) : row_loss.as<float>();
  a.divisor = divisor_first ? divisor.as<float>() : nullptr;
  if (divisor_first) {
    loss::mean_divisor(probs ? nullptr : a.target, a.target64, rows, a.ignore, a.weight, a.classes, divisor.as<float>(),
                       stream);
  }
  if (rows > 0) {
    // Per-class weights (cross_entropy.cuh) for probabilities, and for class weights with
    // smoothing; class weights alone only scale each row, in the plain kernels.
    const bool classes = probs || (a.weight && a.eps > 0.f);
    const bool aligned = same_alignment(logits, grad) && (!probs || same_alignment(logits, &target));
    const bool vec = vectorizable(logits) && (!grad || vectorizable(*grad)) && (!probs || vectorizable(target));
    const Call c{a, logits.dtype, classes, aligned, vec};
    runtime::run_first<RowTier<Access::vectors>, RowTier<Access::split>, RowTier<Access::scalar>>(
        kOp, c, runtime::device_props(logits.device.index), stream);
  }
  if (divisor_first || !mean) {
    if (!none) loss::sum_rows(a.row_loss, rows, a.divisor, static_cast<float*>(loss.data), stream);
  } else {
    loss::mean_rows(a.row_loss, rows, probs ? nullptr : a.target, a.target64, a.ignore, a.weight, a.classes,
                    static_cast<float*>(loss.data), stream);
  }
}

void loss::mean_divisor(const void* target, bool target64, int64_t rows, int64_t ignore, const float* weight,
                        int64_t classes, float* divisor, cudaStream_t stream) {
  divisor_kernel<<<1, 1024, 0, stream>>>(MeanOf{target, target64, rows, ignore, weight, classes}, divisor);
  TESSERA_LAUNCH_CHECK();
}

void loss::sum_rows(const float* row_loss, int64_t rows, const float* divisor, float* loss, cudaStream_t stream) {
  reduce_kernel<<<1, 1024, 0, stream>>>(row_loss, rows, divisor, MeanOf{}, false, loss);
  TESSERA_LAUNCH_CHECK();
}

void loss::mean_rows(const float* row_loss, int64_t rows, const void* target, bool target64, int64_t ignore,
                     const float* weight, int64_t classes, float* loss, cudaStream_t stream) {
  reduce_kernel<<<1, 1024, 0, stream>>>(row_loss, rows, nullptr, MeanOf{target, target64, rows, ignore, weight, classes},
                                        true, loss);
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

void parse(const char* op, std::string_view name, Reduction& out) {
  if (name == "mean") out = Reduction::mean;
  else if (name == "sum") out = Reduction::sum;
  else if (name == "none") out = Reduction::none;
  else detail::throw_arg(ErrorKind::value, op, "reduction", "'mean', 'sum' or 'none'", "'" + std::string(name) + "'");
}

namespace {
// cross_entropy with its options as plain arguments, in the schema's order (the description's
// generic kernel): the torch op and its in-place overload, whose gradient is the logits.
void cross_entropy_args(const TensorView& logits, const TensorView& target, const TensorView* weight,
                        int64_t ignore_index, Reduction reduction, double label_smoothing, double z_loss,
                        double softcap, const TensorView& loss, const TensorView* lse, const TensorView* grad,
                        cudaStream_t stream) {
  CrossEntropyOptions o;
  o.ignore_index = ignore_index, o.reduction = reduction, o.label_smoothing = label_smoothing;
  o.z_loss = z_loss, o.softcap = softcap, o.weight = weight;
  cross_entropy(logits, target, loss, lse, grad, o, stream);
}

// The loss by the reduction, the float32 lse of each row, and (with_grad) the gradient for a
// loss gradient of 1. Autograd is written by hand (python/src/torch/loss.cpp): the forward's
// gradient is saved and scaled in place by the backward overload.
const char* const kOptions = "int ignore_index=-100, str reduction=\"mean\", float label_smoothing=0.0, "
                             "float z_loss=0.0, float softcap=0.0";
const std::vector<std::string> kArgs = {"logits", "target", "weight", "ignore_index", "reduction",
                                        "label_smoothing", "z_loss", "softcap", "loss", "lse"};
std::vector<std::string> with(std::vector<std::string> v, const char* last) {
  v.push_back(last);
  return v;
}
const OpRegistrar kCrossEntropy =
    describe("cross_entropy", "loss",
             "cross-entropy of logits [N, V] against class indices or class probabilities, with the gradient in "
             "the same pass")
        .schema(std::string("cross_entropy(Tensor logits, Tensor target, Tensor? weight=None, *, ") + kOptions +
                ", bool with_grad=False) -> (Tensor, Tensor, Tensor)")
        .kernel<&cross_entropy_args>(with(kArgs, "grad"), {out::loss("loss", "logits", "reduction"),
                                                            out::per_row("lse", "logits"),
                                                            out::like("grad", "logits").when("with_grad")})
        .own_dtype_args({"target"})  // class indices, or probabilities in the logits' dtype
        .float32_args({"weight"})
        .overload(describe("cross_entropy.inplace", "loss", "cross_entropy with the gradient written over the logits")
                      .schema(std::string("cross_entropy.inplace(Tensor(a!) logits, Tensor target, Tensor? "
                                          "weight=None, *, ") + kOptions + ") -> (Tensor, Tensor)")
                      .kernel<&cross_entropy_args>(with(kArgs, "logits"), {out::loss("loss", "logits", "reduction"),
                                                                           out::per_row("lse", "logits")}))
        .overload(describe("cross_entropy.backward", "loss", "cross_entropy's saved gradient scaled by the loss's")
                      .schema("cross_entropy.backward(Tensor grad_loss, Tensor(a!) grad, *, str reduction=\"mean\") -> ()")
                      .kernel<&cross_entropy_backward>({"grad_loss", "grad", "reduction"}, {}))
        .torch("torch.nn.functional.cross_entropy");
}  // namespace
}  // namespace tessera
