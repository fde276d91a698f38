// linear_cross_entropy: the cross-entropy of hidden @ weight^T + bias against target, and its
// gradients, without the [N, V] logits (tessera/ops/loss.hpp).
//
// FLOPs and bytes: three GEMMs of 2 N V H FLOPs each (the logits, d_hidden = G W and
// d_weight = G^T hidden, G the logits' gradient), against which the cross-entropy's pass over a
// chunk (read, then its gradient written in place) is small: the op runs at the GEMM's rate. The
// chunks bound the memory to one chunk's logits. d_weight takes each chunk's part added to the
// previous ones (the GEMM's beta), V H sizeof(T) more bytes read per chunk after the first: chunks
// as large as the memory allows keep that small.
//
// The mean's 1 / count and the loss gradient multiply the GEMMs' products through their device
// scale, so that neither is a pass of its own and nothing synchronizes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>

#include "ops/loss/reduce.hpp"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/loss.hpp"
#include "tessera/ops/matrix.hpp"
#include "tile/convert.cuh"
#include "tile/frag.cuh"
#include "tile/reduce.cuh"
#include "tessera/op.hpp"

namespace tessera {
namespace {

constexpr const char* kOp = "linear_cross_entropy";
constexpr int64_t kScratchChunkBytes = int64_t(1) << 29;

// A chunk's bytes from the scratch pool: 512 MiB, or a quarter of the free memory where that is
// less (one chunk's logits are the op's extra memory). Each chunk after the first reads and writes
// d_weight once more (4 V H bytes against the chunk's 6 rows V H FLOPs): at 2048 rows about 5% of
// the op's time on an H100-class GPU; halving the chunk doubles it.
int64_t chunk_bytes() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return kScratchChunkBytes;
  }
  return std::min<int64_t>(kScratchChunkBytes, static_cast<int64_t>(free / 4));
}
constexpr int kBiasThreads = 256, kBiasUnroll = 8;
constexpr int kHitThreads = 512;

// Rows [r0, r0 + rows) of a 1-d or 2-d view.
TensorView rows_of(const TensorView& t, int64_t r0, int64_t rows) {
  TensorView v = t;
  v.data = static_cast<char*>(t.data) + r0 * t.strides[0] * int64_t(dtype_size(t.dtype));
  v.shape[0] = rows;
  return v;
}

using runtime::transposed;

// The factor of the gradients: the loss gradient (1 where none is given), over the count for a
// mean. A mean over no rows has only ignored rows, whose gradients are 0 and stay 0 (as torch's).
__global__ void factor_kernel(const float* valid, const float* grad_loss, float* factor) {
  const float g = grad_loss ? *grad_loss : 1.0f;
  *factor = !valid ? g : *valid > 0 ? g / *valid : 0.0f;
}

// d_bias, a column per thread: acc[c] = (first ? 0 : acc[c]) + the chunk's column sum of grad; on
// the last chunk (out set) out[c] = factor * that instead. Rows in a fixed order: the same bits
// every run.
template <class T>
__global__ void __launch_bounds__(kBiasThreads)
    bias_grad_kernel(const T* grad, int64_t gs, int64_t rows, int64_t classes, float* acc,
                     bool first, T* out, int64_t os, const float* factor) {
  const int64_t c = blockIdx.x * int64_t(kBiasThreads) + threadIdx.x;
  if (c >= classes) return;
  float s[kBiasUnroll] = {};
  int64_t r = 0;
  for (; r + kBiasUnroll <= rows; r += kBiasUnroll)
#pragma unroll
    for (int i = 0; i < kBiasUnroll; ++i) s[i] += tile::to_float(grad[(r + i) * gs + c]);
  for (; r < rows; ++r) s[0] += tile::to_float(grad[r * gs + c]);
  float total = first ? 0.0f : acc[c];
#pragma unroll
  for (int i = 0; i < kBiasUnroll; ++i) total += s[i];
  if (out) out[c * os] = tile::from_float<T>(factor ? total * *factor : total);
  else acc[c] = total;
}

void launch_bias_grad(const TensorView& g, float* acc, bool first, const TensorView* out,
                      const float* factor, cudaStream_t stream) {
  const int64_t rows = g.shape[0], classes = g.shape[1];
  const unsigned blocks = runtime::grid_cap((classes + kBiasThreads - 1) / kBiasThreads);
  const auto run = [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    bias_grad_kernel<T><<<blocks, kBiasThreads, 0, stream>>>(
        p, g.strides[0], rows, classes, acc, first, out ? static_cast<T*>(out->data) : nullptr,
        out ? out->strides[0] : 0, factor);
  };
  switch (g.dtype) {
    case DType::float32: run(static_cast<const float*>(g.data)); break;
    case DType::float16: run(static_cast<const __half*>(g.data)); break;
    default: run(static_cast<const __nv_bfloat16*>(g.data)); break;
  }
  TESSERA_LAUNCH_CHECK();
}

// Token accuracy and predicted tokens, a CTA per row of a chunk's logits (before the
// cross-entropy overwrites them with their gradient): the row's argmax, the first index of the
// maximum as torch.argmax's, written to predicted (-1 for an ignored row) and counted against the
// target: counts[0] += hits, counts[1] += rows not ignored. Either may be null. V elements a
// load (W: 16 bytes where the rows are aligned, else 1).
struct Best {
  float v;
  int64_t i;
};
struct BestMerge {
  __device__ Best operator()(Best a, Best b) const { return b.v > a.v || (b.v == a.v && b.i < a.i) ? b : a; }
};

template <class T, int W, class P>
__global__ void __launch_bounds__(kHitThreads)
    hits_kernel(const T* logits, int64_t rows, int64_t classes, const void* target, bool target64,
                int64_t ignore, unsigned* counts, P* predicted) {
  __shared__ Best scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t t = target64 ? static_cast<const int64_t*>(target)[r] : static_cast<const int*>(target)[r];
    if (t == ignore) {  // the same for every thread of the CTA
      if (predicted && threadIdx.x == 0) predicted[r] = P(-1);
      continue;
    }
    const T* row = logits + r * classes;
    Best b{-INFINITY, classes};
    for (int64_t c = int64_t(threadIdx.x) * W; c < classes; c += int64_t(blockDim.x) * W) {
      float x[W];
      tile::unpack(tile::load_frag<T, W>(row + c), x);
#pragma unroll
      for (int e = 0; e < W; ++e)
        if (x[e] > b.v) b = {x[e], c + e};  // ascending c: the first of equal maxima stays
    }
    b = tile::block_reduce(b, BestMerge{}, Best{-INFINITY, classes}, scratch);
    if (threadIdx.x == 0) {
      if (predicted) predicted[r] = P(b.i);
      if (counts) {
        if (b.i == t) atomicAdd(&counts[0], 1u);
        atomicAdd(&counts[1], 1u);
      }
    }
  }
}

__global__ void accuracy_kernel(const unsigned* counts, float* accuracy) {
  *accuracy = counts[1] > 0 ? float(counts[0]) / float(counts[1]) : NAN;
}

void launch_hits(const TensorView& logits, const TensorView& target, int64_t ignore, unsigned* counts,
                 const TensorView* predicted, cudaStream_t stream) {
  const int64_t rows = logits.shape[0], classes = logits.shape[1];
  const unsigned blocks = runtime::grid_cap(rows);
  const bool t64 = target.dtype == DType::int64;
  const auto run = [&](auto* p) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(p)>>;
    constexpr int W = 16 / sizeof(T);
    const bool vec = classes % W == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0;
    const auto go = [&](auto* out) {  // predicted in the target's dtype, or none
      using P = std::remove_pointer_t<decltype(out)>;
      if (vec) hits_kernel<T, W, P><<<blocks, kHitThreads, 0, stream>>>(p, rows, classes, target.data, t64, ignore, counts, out);
      else hits_kernel<T, 1, P><<<blocks, kHitThreads, 0, stream>>>(p, rows, classes, target.data, t64, ignore, counts, out);
    };
    if (!predicted) go(static_cast<int64_t*>(nullptr));
    else if (predicted->dtype == DType::int64) go(static_cast<int64_t*>(predicted->data));
    else go(static_cast<int*>(predicted->data));
  };
  switch (logits.dtype) {
    case DType::float32: run(static_cast<const float*>(logits.data)); break;
    case DType::float16: run(static_cast<const __half*>(logits.data)); break;
    default: run(static_cast<const __nv_bfloat16*>(logits.data)); break;
  }
  TESSERA_LAUNCH_CHECK();
}

// A 2-d or 1-d argument of `shape` (`what` says it in words for the error).
void check_shape(const char* arg, const TensorView& t, std::initializer_list<int64_t> shape,
                 const std::string& what) {
  bool ok = t.ndim == int(shape.size());
  int i = 0;
  for (int64_t s : shape) ok = ok && t.shape[i++] == s;
  if (!ok) detail::throw_arg(ErrorKind::value, kOp, arg, what, detail::dims(t));
}

void check(const TensorView& hidden, const TensorView& weight, const TensorView* bias,
           const TensorView& target, const TensorView& loss, const TensorView* lse,
           const LinearCrossEntropyGrads& g, const LinearCrossEntropyOptions& o) {
  detail::check_cuda_tensor(kOp, "hidden", hidden);
  detail::check_dtype_in(kOp, "hidden", hidden, {DType::bfloat16, DType::float16, DType::float32});
  if (hidden.ndim != 2)
    detail::throw_arg(ErrorKind::value, kOp, "hidden", "a 2-d tensor [N, H]", detail::dims(hidden));
  const int64_t n = hidden.shape[0], h = hidden.shape[1];
  detail::check_cuda_tensor(kOp, "weight", weight);
  detail::check_same_dtype(kOp, "weight", weight, "hidden", hidden);
  detail::check_same_device(kOp, "weight", weight, "hidden", hidden);
  if (weight.ndim != 2 || weight.shape[1] != h || weight.shape[0] < 1)
    detail::throw_arg(ErrorKind::value, kOp, "weight",
                      "a 2-d tensor [V, H] with V >= 1 and H = " + std::to_string(h) + " (hidden's)", detail::dims(weight));
  const int64_t v = weight.shape[0];
  if (bias) {
    detail::check_cuda_tensor(kOp, "bias", *bias);
    detail::check_same_dtype(kOp, "bias", *bias, "weight", weight);
    detail::check_same_device(kOp, "bias", *bias, "weight", weight);
    check_shape("bias", *bias, {v}, "a 1-d tensor of V = " + std::to_string(v));
  }
  detail::check_cuda_tensor(kOp, "target", target);
  detail::check_dtype_in(kOp, "target", target, {DType::int64, DType::int32});
  detail::check_same_device(kOp, "target", target, "hidden", hidden);
  check_shape("target", target, {n}, "a contiguous 1-d tensor of hidden's N = " + std::to_string(n));
  if (target.strides[0] != 1 && n > 1)
    detail::throw_arg(ErrorKind::value, kOp, "target", "a contiguous 1-d tensor", "stride " + std::to_string(target.strides[0]));
  const bool none = o.reduction == Reduction::none;
  const std::string n_floats = "a contiguous 1-d float32 tensor of N = " + std::to_string(n);
  detail::check_cuda_tensor(kOp, "loss", loss);
  detail::check_dtype_in(kOp, "loss", loss, {DType::float32});
  detail::check_same_device(kOp, "loss", loss, "hidden", hidden);
  if (none) check_shape("loss", loss, {n}, n_floats + " (reduction none)");
  else check_shape("loss", loss, {}, "a 0-d float32 tensor (reduction mean or sum)");
  if (lse) {
    detail::check_cuda_tensor(kOp, "lse", *lse);
    detail::check_dtype_in(kOp, "lse", *lse, {DType::float32});
    detail::check_same_device(kOp, "lse", *lse, "hidden", hidden);
    check_shape("lse", *lse, {n}, n_floats);
  }
  for (auto [arg, t] : {std::pair{"loss", &loss}, std::pair{"lse", lse}})
    if (t && t->ndim == 1 && t->strides[0] != 1 && n > 1)
      detail::throw_arg(ErrorKind::value, kOp, arg, n_floats, "stride " + std::to_string(t->strides[0]));
  for (auto [arg, t] : {std::pair{"d_hidden", g.d_hidden}, std::pair{"d_weight", g.d_weight}}) {
    if (!t) continue;
    const bool dw = t == g.d_weight;
    TensorView like = dw ? weight : hidden;
    if (dw) {  // weight's dtype, or float32: the chunks accumulated in float32
      detail::check_cuda_tensor(kOp, arg, *t);
      detail::check_dtype_in(kOp, arg, *t, {weight.dtype, DType::float32});
      like.dtype = t->dtype;
    }
    detail::check_like(kOp, arg, *t, dw ? "weight" : "hidden", like);
    detail::check_no_internal_overlap(kOp, arg, *t);
  }
  if (g.d_bias) {
    if (!bias) detail::throw_arg(ErrorKind::value, kOp, "d_bias", "nullptr (there is no bias)", "a tensor");
    detail::check_like(kOp, "d_bias", *g.d_bias, "bias", *bias);
    detail::check_no_internal_overlap(kOp, "d_bias", *g.d_bias);
  }
  if (g.grad_loss) {
    detail::check_cuda_tensor(kOp, "grad_loss", *g.grad_loss);
    detail::check_dtype_in(kOp, "grad_loss", *g.grad_loss, {DType::float32});
    detail::check_same_device(kOp, "grad_loss", *g.grad_loss, "hidden", hidden);
    if (none) check_shape("grad_loss", *g.grad_loss, {n}, "a 1-d tensor of N = " + std::to_string(n) + " (reduction none)");
    else check_shape("grad_loss", *g.grad_loss, {}, "a 0-d tensor (reduction mean or sum)");
  }
  // The outputs apart from one another and from every input.
  using Arg = std::pair<const char*, const TensorView*>;
  const Arg outs[] = {{"loss", &loss}, {"lse", lse}, {"d_hidden", g.d_hidden}, {"d_weight", g.d_weight},
                      {"d_bias", g.d_bias}, {"accuracy", o.accuracy}, {"predicted", o.predicted}};
  const Arg ins[] = {{"hidden", &hidden}, {"weight", &weight}, {"bias", bias}, {"target", &target},
                     {"grad_loss", g.grad_loss}, {"weight (class weights)", o.weight}};
  for (std::size_t i = 0; i < std::size(outs); ++i) {
    if (!outs[i].second) continue;
    for (std::size_t j = i + 1; j < std::size(outs); ++j)
      if (outs[j].second)
        detail::check_no_overlap(kOp, outs[j].first, *outs[j].second, outs[i].first, *outs[i].second, false);
    for (const Arg& in : ins)
      if (in.second) detail::check_no_overlap(kOp, outs[i].first, *outs[i].second, in.first, *in.second, false);
  }
  if (const TensorView* w = o.workspace) {
    detail::check_cuda_tensor(kOp, "workspace", *w);
    detail::check_same_dtype(kOp, "workspace", *w, "hidden", hidden);
    detail::check_same_device(kOp, "workspace", *w, "hidden", hidden);
    if (!w->is_contiguous() || w->numel() < v)
      detail::throw_arg(ErrorKind::value, kOp, "workspace",
                        "a contiguous tensor of at least V = " + std::to_string(v) + " elements", detail::dims(*w));
    const auto apart = [&](const Arg& a) {
      if (a.second) detail::check_no_overlap(kOp, "workspace", *w, a.first, *a.second, false);
    };
    for (const Arg& a : outs) apart(a);
    for (const Arg& a : ins) apart(a);
  }
  if (const TensorView* w = o.weight) {  // class weights: cross_entropy's, V float32 values
    detail::check_cuda_tensor(kOp, "weight (class weights)", *w);
    detail::check_dtype_in(kOp, "weight (class weights)", *w, {DType::float32});
    detail::check_same_device(kOp, "weight (class weights)", *w, "hidden", hidden);
    if (w->ndim != 1 || w->shape[0] != v || (v > 1 && w->strides[0] != 1))
      detail::throw_arg(ErrorKind::value, kOp, "weight (class weights)",
                        "a contiguous 1-d float32 tensor of V = " + std::to_string(v) + " class weights", detail::dims(*w));
    // With z_loss: cross_entropy's convention (the z-term weighted as the row's lse), per chunk.
  }
  if (const TensorView* a = o.accuracy) {
    detail::check_cuda_tensor(kOp, "accuracy", *a);
    detail::check_dtype_in(kOp, "accuracy", *a, {DType::float32});
    detail::check_same_device(kOp, "accuracy", *a, "hidden", hidden);
    check_shape("accuracy", *a, {}, "a 0-d float32 tensor");
  }
  if (const TensorView* p = o.predicted) {
    detail::check_cuda_tensor(kOp, "predicted", *p);
    detail::check_same_dtype(kOp, "predicted", *p, "target", target);
    detail::check_same_device(kOp, "predicted", *p, "hidden", hidden);
    check_shape("predicted", *p, {n}, "a contiguous 1-d tensor of N = " + std::to_string(n) + " rows");
    if (n > 1 && p->strides[0] != 1)
      detail::throw_arg(ErrorKind::value, kOp, "predicted", "a contiguous 1-d tensor", "stride " + std::to_string(p->strides[0]));
  }
  if (o.chunk_rows < 0)
    detail::throw_arg(ErrorKind::value, kOp, "chunk_rows", "a count >= 0 (0: chosen)", std::to_string(o.chunk_rows));
}

}  // namespace

void linear_cross_entropy(const TensorView& hidden, const TensorView& weight, const TensorView* bias,
                          const TensorView& target, const TensorView& loss, const TensorView* lse,
                          const LinearCrossEntropyGrads& grads, const LinearCrossEntropyOptions& options,
                          cudaStream_t stream) {
  runtime::NvtxRange range("tessera::linear_cross_entropy");
  check(hidden, weight, bias, target, loss, lse, grads, options);
  runtime::DeviceGuard guard(hidden.device.index);
  const Device dev = hidden.device;
  const int64_t n = hidden.shape[0], v = weight.shape[0];
  const int64_t elem = int64_t(dtype_size(hidden.dtype));
  const bool none = options.reduction == Reduction::none, mean = options.reduction == Reduction::mean;
  const bool want = grads.d_hidden || grads.d_weight || grads.d_bias;

  int64_t chunk = options.workspace ? options.workspace->numel() / v : chunk_bytes() / (v * elem);
  if (!options.workspace && chunk >= 256) chunk = chunk / 256 * 256;
  if (options.chunk_rows > 0) chunk = std::min(chunk, options.chunk_rows);
  chunk = std::max<int64_t>(1, std::min(chunk, n));
  runtime::Scratch own(options.workspace || n == 0 ? 0 : std::size_t(chunk * v * elem), stream);
  void* ws = options.workspace ? options.workspace->data : own.data();
  runtime::Scratch row_loss(none ? 0 : std::size_t(std::max<int64_t>(n, 1)) * sizeof(float), stream),
      valid(mean ? sizeof(float) : 0, stream), factor(sizeof(float), stream),
      bias_acc(grads.d_bias ? std::size_t(v) * sizeof(float) : 0, stream),
      counts(options.accuracy ? 2 * sizeof(unsigned) : 0, stream);
  if (options.accuracy) TESSERA_CUDA_CHECK(cudaMemsetAsync(counts.data(), 0, 2 * sizeof(unsigned), stream));
  if (mean)
    loss::mean_divisor(target.data, target.dtype == DType::int64, n, options.ignore_index,
                       options.weight ? static_cast<const float*>(options.weight->data) : nullptr, v,
                       valid.as<float>(), stream);

  // The gradients' factor where it is not 1 for every row (none: per-row, applied to the chunk).
  const TensorView factor_view = TensorView::contiguous(factor.data(), DType::float32, {}, dev);
  const bool scaled = want && !none && (mean || grads.grad_loss);
  if (scaled) {
    factor_kernel<<<1, 1, 0, stream>>>(mean ? valid.as<float>() : nullptr,
                                       grads.grad_loss ? static_cast<const float*>(grads.grad_loss->data) : nullptr,
                                       factor.as<float>());
    TESSERA_LAUNCH_CHECK();
  }
  if (want && n == 0) {  // no chunk runs: d_weight and d_bias are the gradients of an empty sum
    const TensorView none_rows = TensorView::contiguous(ws, hidden.dtype, {0, v}, dev);
    if (grads.d_weight) matmul(transposed(none_rows), hidden, *grads.d_weight, MatmulOptions{}, stream);
    if (grads.d_bias) launch_bias_grad(none_rows, bias_acc.as<float>(), true, grads.d_bias, nullptr, stream);
  }

  CrossEntropyOptions ce = options;
  ce.reduction = Reduction::none;
  const TensorView row_losses = none ? loss : TensorView::contiguous(row_loss.data(), DType::float32, {n}, dev);
  MatmulOptions fwd, bwd;
  fwd.bias = bias;
  bwd.scale = scaled ? &factor_view : nullptr;
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t rows = std::min(chunk, n - c0);
    const TensorView logits = TensorView::contiguous(ws, hidden.dtype, {rows, v}, dev);
    const TensorView h = rows_of(hidden, c0, rows);
    matmul(h, transposed(weight), logits, fwd, stream);
    if (options.accuracy || options.predicted) {
      const TensorView pred = options.predicted ? rows_of(*options.predicted, c0, rows) : TensorView{};
      launch_hits(logits, rows_of(target, c0, rows), options.ignore_index,
                  options.accuracy ? counts.as<unsigned>() : nullptr, options.predicted ? &pred : nullptr, stream);
    }
    const TensorView lse_rows = lse ? rows_of(*lse, c0, rows) : TensorView{};
    cross_entropy(logits, rows_of(target, c0, rows), rows_of(row_losses, c0, rows), lse ? &lse_rows : nullptr,
                  want ? &logits : nullptr, ce, stream);
    if (!want) continue;
    if (none && grads.grad_loss)
      cross_entropy_backward(rows_of(*grads.grad_loss, c0, rows), logits, Reduction::none, stream);
    if (grads.d_hidden) matmul(logits, weight, rows_of(*grads.d_hidden, c0, rows), bwd, stream);
    if (grads.d_weight) {
      MatmulOptions acc = bwd;
      acc.beta = c0 > 0 ? 1.0 : 0.0;
      matmul(transposed(logits), h, *grads.d_weight, acc, stream);
    }
    if (grads.d_bias)
      launch_bias_grad(logits, bias_acc.as<float>(), c0 == 0, c0 + rows >= n ? grads.d_bias : nullptr,
                       scaled ? factor.as<float>() : nullptr, stream);
  }
  if (!none) loss::sum_rows(row_loss.as<float>(), n, mean ? valid.as<float>() : nullptr, static_cast<float*>(loss.data), stream);
  if (options.accuracy) {
    accuracy_kernel<<<1, 1, 0, stream>>>(counts.as<unsigned>(), static_cast<float*>(options.accuracy->data));
    TESSERA_LAUNCH_CHECK();
  }
}

}  // namespace tessera

namespace tessera {
namespace {
// linear_cross_entropy with its options and gradients as plain arguments, in the schema's order
// (the description's generic kernel).
void linear_cross_entropy_args(const TensorView& hidden, const TensorView& weight, const TensorView* bias,
                               const TensorView& target, int64_t ignore_index, Reduction reduction,
                               double label_smoothing, double z_loss, double softcap, int64_t chunk_rows,
                               const TensorView* grad_loss, const TensorView* ce_weight, const TensorView& loss,
                               const TensorView* lse, const TensorView* d_hidden, const TensorView* d_weight,
                               const TensorView* d_bias, const TensorView* accuracy, const TensorView* predicted,
                               cudaStream_t stream) {
  LinearCrossEntropyOptions o;
  o.ignore_index = ignore_index, o.reduction = reduction, o.label_smoothing = label_smoothing;
  o.z_loss = z_loss, o.softcap = softcap, o.weight = ce_weight, o.chunk_rows = chunk_rows, o.accuracy = accuracy;
  o.predicted = predicted;
  // d_weight's dtype is the schema's accum_dtype: name it so.
  if (d_weight && d_weight->dtype != weight.dtype && d_weight->dtype != DType::float32)
    detail::throw_arg(ErrorKind::value, kOp, "accum_dtype",
                      std::string("None, float32 or the weight's dtype ") + dtype_name(weight.dtype),
                      dtype_name(d_weight->dtype));
  LinearCrossEntropyGrads g;
  g.d_hidden = d_hidden, g.d_weight = d_weight, g.d_bias = d_bias, g.grad_loss = grad_loss;
  linear_cross_entropy(hidden, weight, bias, target, loss, lse, g, o, stream);
}

OpDesc::Output accuracy() {
  OpDesc::Output o = out::like("accuracy", "hidden");
  o.dtype = OpDesc::Output::Dtype::float32;
  o.shape = OpDesc::Output::Shape::scalar;
  return std::move(o).when("token_accuracy");
}

// The gradients wanted (output_mask; d_bias only with a bias), d_weight in accum_dtype where
// given. Autograd is written by hand (python/src/torch/loss.cpp): the forward's gradients are
// saved and scaled by the backward, or, for 'none', the chunks run again with grad_loss.
OpDesc::Output d_weight() {
  OpDesc::Output o = out::like("d_weight", "weight").when("output_mask", 1);
  o.dtype_from = "accum_dtype";
  return o;
}

const OpRegistrar kLinearCrossEntropy =
    describe("linear_cross_entropy", "loss",
             "cross-entropy of hidden @ weight^T + bias against class targets, with d_hidden and d_weight, in chunks")
        .schema("linear_cross_entropy(Tensor hidden, Tensor weight, Tensor? bias, Tensor target, *, int "
                "ignore_index=-100, str reduction=\"mean\", float label_smoothing=0.0, float z_loss=0.0, float "
                "softcap=0.0, int chunk_rows=0, bool[3] output_mask=[False, False, False], Tensor? grad_loss=None, "
                "Tensor? ce_weight=None, ScalarType? accum_dtype=None, bool token_accuracy=False, bool "
                "predicted_tokens=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
        .kernel<&linear_cross_entropy_args>(
            {"hidden", "weight", "bias", "target", "ignore_index", "reduction", "label_smoothing", "z_loss", "softcap",
             "chunk_rows", "grad_loss", "ce_weight", "loss", "lse", "d_hidden", "d_weight", "d_bias", "accuracy",
             "predicted"},
            {out::loss("loss", "hidden", "reduction"), out::per_row("lse", "hidden"),
             out::like("d_hidden", "hidden").when("output_mask", 0), d_weight(),
             out::like("d_bias", "bias").when("output_mask", 2), accuracy(),
             out::like("predicted", "target").when("predicted_tokens")});
}  // namespace
}  // namespace tessera
