// LayerNorm and RMSNorm (torch's semantics; see tessera/ops/rowwise.hpp), and the same fused with
// a residual add (add_layer_norm, add_rms_norm): argument checks, layouts, dtype dispatch and the
// public functions. The kernels and their tiers are in norm_forward.cuh, norm_backward.cuh
// and norm_staged.cu (norm.cuh says what bounds them).
//
// Layouts: the kernels need the normalized block of x/out (dy/dx) dense (stride 1 innermost,
// contiguous over the normalized dimensions) and the rows at a uniform stride (leading dimensions
// that collapse into one: any contiguous or row-sliced layout), mean/rstd likewise at a uniform
// stride. Any other layout is gathered into contiguous scratch memory with tessera::copy first
// (outputs: computed there and scattered back after), as are non-contiguous weight/bias and
// dw/db. The 16-byte vector path needs N % V == 0 and every row start 16-byte aligned; otherwise
// the same kernels run with V = 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "ops/matrix/float8_quantize.cuh"
#include "ops/rowwise/norm.cuh"
#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/rowwise.hpp"
#include "tessera/op.hpp"

namespace tessera {
namespace {

using norm::AddBwdParams;
using norm::AddFwdParams;
using norm::BwdArgs;

template <class F>
void with_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::float32: f(float{}); break;
    case DType::float16: f(__half{}); break;
    default: f(__nv_bfloat16{}); break;
  }
}

// ---- shapes, layouts and checks ---------------------------------------------------------------
int64_t product(const int64_t* s, int from, int to) {
  int64_t p = 1;
  for (int d = from; d < to; ++d) p *= s[d];
  return p;
}

// True when dimensions [lead, ndim) form one dense block (stride 1 innermost, row-major).
bool block_dense(const TensorView& t, int lead) {
  int64_t expected = 1;
  for (int d = t.ndim - 1; d >= lead; --d) {
    if (t.shape[d] == 1) continue;
    if (t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

// The distance between consecutive rows when the first `lead` dimensions of t collapse into one
// (row r then starts at r * stride), or nothing when they do not.
std::optional<int64_t> row_stride(const TensorView& t, int lead) {
  std::optional<int64_t> stride;
  int64_t extent = 1;
  for (int d = lead - 1; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (!stride) stride = t.strides[d];
    else if (t.strides[d] != *stride * extent) return std::nullopt;
    extent *= t.shape[d];
  }
  return stride.value_or(0);
}

// Every row of t starts on a 16-byte boundary. (The vector path also needs N % V == 0: Cols.)
template <class T>
bool rows_aligned(const TensorView& t, int64_t stride) {
  constexpr int V = tile::kVec16<T>;
  return tile::is_aligned<T, V>(t.data) && stride % V == 0;
}

// What the kernels index: a uniform row stride and, for x-like tensors (`block`), a dense
// normalized block. Layouts that are neither get a contiguous copy in scratch memory: inputs
// are copied in here, outputs are written there and copied out by copy_back().
bool kernel_ready(const TensorView& t, int lead, bool block) {
  return (!block || block_dense(t, lead)) && row_stride(t, lead).has_value();
}

TensorView contiguous_scratch(const TensorView& t, runtime::Scratch& keep, cudaStream_t stream) {
  keep = runtime::Scratch(t.nbytes(), stream);
  return TensorView::make(keep.data(), t.dtype, t.shape, nullptr, t.ndim, t.device);
}

TensorView as_input(const TensorView& t, int lead, bool block, runtime::Scratch& keep, cudaStream_t stream) {
  if (kernel_ready(t, lead, block)) return t;
  const TensorView c = contiguous_scratch(t, keep, stream);
  copy(t, c, stream);
  return c;
}

TensorView as_output(const TensorView& t, int lead, bool block, runtime::Scratch& keep, cudaStream_t stream) {
  return kernel_ready(t, lead, block) ? t : contiguous_scratch(t, keep, stream);
}

void copy_back(const TensorView& used, const TensorView* out, cudaStream_t stream) {
  if (out && used.data != out->data) copy(used, *out, stream);
}

// Every byte of t set to `byte`: 0 is zero in every dtype, 0xff a NaN in float32.
void byte_fill(const TensorView& t, int byte, cudaStream_t stream) {
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(t.data, byte, t.nbytes(), stream));
    return;
  }
  runtime::Scratch z;
  const TensorView c = contiguous_scratch(t, z, stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(c.data, byte, c.nbytes(), stream));
  copy(c, t, stream);
}

// `part` of x's shape ("normalized", "leading"): the message is built only for an error.
void check_shape(const char* op, const char* arg, const TensorView& t, const int64_t* shape, int ndim,
                 const char* part, const char* xname) {
  bool same = t.ndim == ndim;
  for (int d = 0; same && d < ndim; ++d) same = t.shape[d] == shape[d];
  if (!same)
    detail::throw_arg(ErrorKind::value, op, arg,
                      "shape " + detail::shape_str(shape, ndim) + " (the " + part + " shape of '" + xname + "')",
                      t.shape_str());
}

// x, the tensor normalized, is the argument `xname` ('input'; the add ops' backward:
// 'residual_out'). The add ops normalize the last dimension (`last`), which x must have.
void check_x(const char* op, const char* xname, const TensorView& x, int nnorm, bool last) {
  detail::check_cuda_tensor(op, xname, x);
  detail::check_dtype_in(op, xname, x, {DType::float32, DType::float16, DType::bfloat16});
  if (last && x.ndim < 1)
    detail::throw_arg(ErrorKind::value, op, xname, "a tensor of at least 1 dimension (the last is normalized)",
                      "a 0-d tensor");
  if (nnorm < 1 || nnorm > x.ndim)
    detail::throw_arg(ErrorKind::value, op, "normalized_ndim",
                      "1 <= normalized_ndim <= x.ndim = " + std::to_string(x.ndim), std::to_string(nnorm));
}

// A tensor like x (grad_out, out, grad_in).
// weight, bias, grad_weight, grad_bias: x's dtype, the normalized shape.
void check_param(const char* op, const char* arg, const TensorView& t, const char* xname, const TensorView& x,
                 int lead) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_device(op, arg, t, xname, x);
  detail::check_same_dtype(op, arg, t, xname, x);
  check_shape(op, arg, t, x.shape + lead, x.ndim - lead, "normalized", xname);
}

// mean, rstd: float32, the leading shape.
void check_stats(const char* op, const char* arg, const TensorView& t, const char* xname, const TensorView& x,
                 int lead) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_device(op, arg, t, xname, x);
  detail::check_dtype_in(op, arg, t, {DType::float32});
  check_shape(op, arg, t, x.shape, lead, "leading", xname);
}

// torch's statistics keep the normalized dimensions as 1s (native_layer_norm's leading + (1,) * k):
// the same values, viewed with the leading shape. Anything else as it is, for check_stats.
TensorView leading_view(const TensorView& t, const TensorView& x, int lead) {
  if (t.ndim != x.ndim || t.ndim == lead) return t;
  for (int d = lead; d < t.ndim; ++d)
    if (t.shape[d] != 1) return t;
  TensorView v = t;
  v.ndim = lead;
  return v;
}

void check_eps(const char* op, double eps) {
  if (!(std::isfinite(eps) && eps >= 0.0 && eps <= FLT_MAX)) {
    std::ostringstream got;
    got << eps;
    detail::throw_arg(ErrorKind::value, op, "eps", "a finite value >= 0 (representable as float32)", got.str());
  }
}

// The weight offset (Gemma's 1 + w) is added in float32 and needs a weight to add to.
void check_offset(const char* op, double offset, const TensorView* weight) {
  if (!(std::isfinite(offset) && std::fabs(offset) <= FLT_MAX)) {
    std::ostringstream got;
    got << offset;
    detail::throw_arg(ErrorKind::value, op, "weight_offset", "a finite value (representable as float32)", got.str());
  }
  if (offset != 0.0 && !weight)
    detail::throw_arg(ErrorKind::value, op, "weight_offset", "0 when 'weight' is not given", "a non-zero offset");
}

struct Named {
  const char* name;
  const TensorView* t;
  const TensorView* may_be = nullptr;  // an input this output may be exactly (in place)
};

// Each output: no element written twice, no overlap with any input or with an earlier output,
// except being exactly its `may_be` input (the add ops in place: each element is read before it
// is written, by the thread that writes it).
void check_outputs(const char* op, std::initializer_list<Named> outs, std::initializer_list<Named> ins) {
  for (auto o = outs.begin(); o != outs.end(); ++o) {
    if (!o->t) continue;
    detail::check_no_internal_overlap(op, o->name, *o->t);
    for (const Named& i : ins)
      if (i.t) detail::check_no_overlap(op, o->name, *o->t, i.name, *i.t, o->may_be && o->may_be == i.t);
    for (auto s = outs.begin(); s != o; ++s)
      if (s->t) detail::check_no_overlap(op, o->name, *o->t, s->name, *s->t, false);
  }
}

// ---- the two drivers ---------------------------------------------------------------------------
// The add ops' residual: the forward's residual and residual_out; none for the plain norms.
struct Residual {
  const TensorView* in = nullptr;
  const TensorView* out = nullptr;
};

// rms_norm_float8's: where the output's maxima go (zeroed words: rows' then columns', or one), and
// whether the norm's kernel took them (else the caller quantizes out in two passes of its own).
struct Float8Sink {
  uint32_t* amax;
  bool rows_max;
  bool fused = false;
};

void norm_forward(const char* op, bool rms, const TensorView& x, int nnorm, const TensorView* weight,
                  const TensorView* bias, double eps, double w_offset, const TensorView& out,
                  const TensorView* mean, const TensorView* rstd, Residual res, cudaStream_t stream,
                  Float8Sink* sink = nullptr) {
  check_x(op, "input", x, nnorm, res.in != nullptr);
  const int lead = x.ndim - nnorm;
  if (res.in) detail::check_like(op, "residual", *res.in, "input", x);
  if (weight) check_param(op, "weight", *weight, "input", x, lead);
  if (bias) check_param(op, "bias", *bias, "input", x, lead);
  check_eps(op, eps);
  check_offset(op, w_offset, weight);
  detail::check_like(op, "out", out, "input", x);
  if (res.out) detail::check_like(op, "residual_out", *res.out, "input", x);
  if (mean) check_stats(op, "mean", *mean, "input", x, lead);
  if (rstd) check_stats(op, "rstd", *rstd, "input", x, lead);
  // The add ops may run in place as vLLM's fused_add_rms_norm does: out over input, residual_out
  // over residual.
  check_outputs(op,
                {{"out", &out, res.in ? &x : nullptr}, {"residual_out", res.out, res.in}, {"mean", mean},
                 {"rstd", rstd}},
                {{"input", &x}, {"residual", res.in}, {"weight", weight}, {"bias", bias}});
  if (x.numel() == 0) {  // rows of no elements have no statistics: NaN, as torch gives
    for (const TensorView* s : {mean, rstd}) {
      if (!s || s->numel() == 0) continue;  // no rows: nothing to write, the GPU untouched
      runtime::DeviceGuard guard(x.device.index);
      byte_fill(*s, 0xff, stream);
    }
    return;
  }

  runtime::DeviceGuard guard(x.device.index);
  runtime::Scratch xs, os, ws, bs, ms, rs, res_s, res_os;
  const TensorView xv = as_input(x, lead, true, xs, stream);
  const TensorView ov = as_output(out, lead, true, os, stream);
  const TensorView wv = weight ? as_input(*weight, 0, true, ws, stream) : TensorView{};
  const TensorView bv = bias ? as_input(*bias, 0, true, bs, stream) : TensorView{};
  const TensorView mv = mean ? as_output(*mean, lead, false, ms, stream) : TensorView{};
  const TensorView rv = rstd ? as_output(*rstd, lead, false, rs, stream) : TensorView{};
  const TensorView resv = res.in ? as_input(*res.in, lead, true, res_s, stream) : TensorView{};
  const TensorView resov = res.out ? as_output(*res.out, lead, true, res_os, stream) : TensorView{};

  with_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = tile::kVec16<T>;
    AddFwdParams<T> p{};
    p.x = static_cast<const T*>(xv.data);
    p.out = static_cast<T*>(ov.data);
    p.w = weight ? static_cast<const T*>(wv.data) : nullptr;
    p.b = bias ? static_cast<const T*>(bv.data) : nullptr;
    p.mean = mean ? static_cast<float*>(mv.data) : nullptr;
    p.rstd = rstd ? static_cast<float*>(rv.data) : nullptr;
    p.stride[0] = *row_stride(xv, lead);
    p.stride[1] = *row_stride(ov, lead);
    p.stride[2] = mean ? *row_stride(mv, lead) : 0;
    p.stride[3] = rstd ? *row_stride(rv, lead) : 0;
    p.rows = product(x.shape, 0, lead);
    p.n = product(x.shape, lead, x.ndim);
    p.inv_n = static_cast<float>(1.0 / static_cast<double>(p.n));
    p.eps = static_cast<float>(eps);
    p.w_offset = static_cast<float>(w_offset);
    bool vec = p.n % V == 0 && rows_aligned<T>(xv, p.stride[0]) && rows_aligned<T>(ov, p.stride[1]) &&
               (!p.w || tile::is_aligned<T, V>(p.w)) && (!p.b || tile::is_aligned<T, V>(p.b));
    if (res.in) {
      p.res = static_cast<const T*>(resv.data);
      p.res_out = static_cast<T*>(resov.data);
      p.res_stride[0] = *row_stride(resv, lead);
      p.res_stride[1] = *row_stride(resov, lead);
      vec = vec && rows_aligned<T>(resv, p.res_stride[0]) && rows_aligned<T>(resov, p.res_stride[1]);
    }
    const norm::Ctx ctx = norm::Ctx::of(x.device.index);
    if (sink && vec && ov.data == out.data) {  // the maxima of out itself, not of a scratch copy
      norm::MaxFwdParams<T> mp{};
      static_cast<norm::AddFwdParams<T>&>(mp) = p;
      mp.amax = sink->amax, mp.rows_max = sink->rows_max;
      sink->fused = norm::forward_float8(op, mp, ctx, stream);
      if (sink->fused) return;
    }
    norm::forward(op, p, rms, vec, ctx, stream);
  });
  copy_back(ov, &out, stream);
  if (res.out) copy_back(resov, res.out, stream);
  if (mean) copy_back(mv, mean, stream);
  if (rstd) copy_back(rv, rstd, stream);
}

// `xname`: the argument x is ('input'; the add ops' backward: 'residual_out'). `dres`: the add ops'
// gradient of residual_out, added to grad_in (nullptr: none). grad_out nullptr (the add ops, where
// only residual_out's gradient came): grad_in is dres and the parameters' gradients are zero.
void norm_backward(const char* op, bool rms, const TensorView* grad_out, const char* xname, const TensorView& x,
                   int nnorm, const TensorView* mean, const TensorView& rstd_in, const TensorView* weight,
                   double w_offset, const TensorView* dres, const TensorView* grad_in, const TensorView* grad_weight,
                   const TensorView* grad_bias, cudaStream_t stream) {
  check_x(op, xname, x, nnorm, std::string(xname) != "input");  // the add ops normalize the last dim
  const int lead = x.ndim - nnorm;
  const TensorView mean_l = mean ? leading_view(*mean, x, lead) : TensorView{};
  const TensorView rstd_l = leading_view(rstd_in, x, lead);
  if (mean) mean = &mean_l;
  const TensorView& rstd = rstd_l;
  if (grad_out) detail::check_like(op, "grad_output", *grad_out, xname, x);
  if (dres) detail::check_like(op, "grad_residual_out", *dres, xname, x);
  if (mean) check_stats(op, "mean", *mean, xname, x, lead);
  check_stats(op, "rstd", rstd, xname, x, lead);
  if (weight) check_param(op, "weight", *weight, xname, x, lead);
  check_offset(op, w_offset, weight);
  if (grad_in) detail::check_like(op, "grad_input", *grad_in, xname, x);
  if (grad_weight) {
    if (!weight)
      detail::throw_arg(ErrorKind::value, op, "grad_weight", "nullptr when 'weight' is not given",
                        "a tensor");
    check_param(op, "grad_weight", *grad_weight, xname, x, lead);
  }
  if (grad_bias) check_param(op, "grad_bias", *grad_bias, xname, x, lead);
  // grad_input may be grad_residual_out itself: dx accumulated in place.
  check_outputs(op, {{"grad_input", grad_in, dres}, {"grad_weight", grad_weight}, {"grad_bias", grad_bias}},
                {{"grad_output", grad_out}, {"grad_residual_out", dres}, {xname, &x}, {"mean", mean},
                 {"rstd", &rstd}, {"weight", weight}});
  if (!grad_in) dres = nullptr;  // nothing to add it to

  const int64_t rows = product(x.shape, 0, lead), n = product(x.shape, lead, x.ndim);
  const bool sums = grad_weight || grad_bias;
  if (n == 0 || (!grad_in && !sums) || (rows == 0 && !sums)) return;
  runtime::DeviceGuard guard(x.device.index);
  if (rows == 0 || !grad_out) {  // column sums over no rows, or of a zero gradient: zeros, as torch gives
    if (grad_weight) byte_fill(*grad_weight, 0, stream);
    if (grad_bias) byte_fill(*grad_bias, 0, stream);
    if (grad_in && rows > 0) dres ? copy(*dres, *grad_in, stream) : byte_fill(*grad_in, 0, stream);
    return;
  }

  runtime::Scratch xs, dys, dxs, ws, dws, dbs, ms, rs, drs, parts, means;
  const TensorView xv = as_input(x, lead, true, xs, stream);
  const TensorView dyv = as_input(*grad_out, lead, true, dys, stream);
  const TensorView mv = mean ? as_input(*mean, lead, false, ms, stream) : TensorView{};
  const TensorView rv = as_input(rstd, lead, false, rs, stream);
  const TensorView wv = weight ? as_input(*weight, 0, true, ws, stream) : TensorView{};
  const TensorView drv = dres ? as_input(*dres, lead, true, drs, stream) : TensorView{};
  const TensorView dxv = grad_in ? as_output(*grad_in, lead, true, dxs, stream) : TensorView{};
  const TensorView dwv = grad_weight ? as_output(*grad_weight, 0, true, dws, stream) : TensorView{};
  const TensorView dbv = grad_bias ? as_output(*grad_bias, 0, true, dbs, stream) : TensorView{};
  const int device = x.device.index;

  with_dtype(x.dtype, [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = tile::kVec16<T>;
    AddBwdParams<T> p{};
    p.dy = static_cast<const T*>(dyv.data);
    p.x = static_cast<const T*>(xv.data);
    p.w = weight ? static_cast<const T*>(wv.data) : nullptr;
    p.w_offset = static_cast<float>(w_offset);
    p.mean = mean ? static_cast<const float*>(mv.data) : nullptr;
    p.rstd = static_cast<const float*>(rv.data);
    p.dx = grad_in ? static_cast<T*>(dxv.data) : nullptr;
    p.dres = dres ? static_cast<const T*>(drv.data) : nullptr;
    p.stride[0] = *row_stride(xv, lead);
    p.stride[1] = *row_stride(dyv, lead);
    p.stride[2] = grad_in ? *row_stride(dxv, lead) : 0;
    p.stride[3] = mean ? *row_stride(mv, lead) : 0;
    p.stride[4] = *row_stride(rv, lead);
    p.dres_stride = dres ? *row_stride(drv, lead) : 0;
    p.rows = rows;
    p.n = n;
    p.ld = runtime::ceil_div(n, 4) * 4;  // 16-byte aligned partial rows
    p.inv_n = static_cast<float>(1.0 / static_cast<double>(n));
    const bool vec = n % V == 0 && rows_aligned<T>(xv, p.stride[0]) && rows_aligned<T>(dyv, p.stride[1]) &&
                     (!grad_in || rows_aligned<T>(dxv, p.stride[2])) && (!p.w || tile::is_aligned<T, V>(p.w)) &&
                     (!dres || rows_aligned<T>(drv, p.dres_stride));
    const BwdArgs<T> a{p, grad_weight ? static_cast<T*>(dwv.data) : nullptr,
                       grad_bias ? static_cast<T*>(dbv.data) : nullptr, device, &parts, &means};
    norm::backward(op, a, rms, vec, norm::Ctx::of(device), stream);
  });
  if (grad_in) copy_back(dxv, grad_in, stream);
  if (grad_weight) copy_back(dwv, grad_weight, stream);
  if (grad_bias) copy_back(dbv, grad_bias, stream);
}

}  // namespace

void layer_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, const TensorView* bias,
                double eps, const TensorView& out, const TensorView* mean, const TensorView* rstd,
                cudaStream_t stream) {
  runtime::NvtxRange range("tessera::layer_norm");
  norm_forward("layer_norm", false, x, normalized_ndim, weight, bias, eps, 0.0, out, mean, rstd, {}, stream);
}

void layer_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                         const TensorView& mean, const TensorView& rstd, const TensorView* weight,
                         const TensorView* grad_in, const TensorView* grad_weight,
                         const TensorView* grad_bias, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::layer_norm_backward");
  norm_backward("layer_norm_backward", false, &grad_out, "input", x, normalized_ndim, &mean, rstd, weight, 0.0,
                nullptr, grad_in, grad_weight, grad_bias, stream);
}

void rms_norm(const TensorView& x, int normalized_ndim, const TensorView* weight, double eps,
              double weight_offset, const TensorView& out, const TensorView* rstd, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rms_norm");
  norm_forward("rms_norm", true, x, normalized_ndim, weight, nullptr, eps, weight_offset, out, nullptr, rstd, {},
               stream);
}

void rms_norm_backward(const TensorView& grad_out, const TensorView& x, int normalized_ndim,
                       const TensorView& rstd, const TensorView* weight, double weight_offset,
                       const TensorView* grad_in, const TensorView* grad_weight, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rms_norm_backward");
  norm_backward("rms_norm_backward", true, &grad_out, "input", x, normalized_ndim, nullptr, rstd, weight,
                weight_offset, nullptr, grad_in, grad_weight, nullptr, stream);
}

void add_layer_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                    const TensorView* bias, double eps, const TensorView& out, const TensorView& residual_out,
                    const TensorView* mean, const TensorView* rstd, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_layer_norm");
  norm_forward("add_layer_norm", false, input, 1, weight, bias, eps, 0.0, out, mean, rstd, {&residual, &residual_out},
               stream);
}

void add_layer_norm_backward(const TensorView* grad_output, const TensorView* grad_residual_out,
                             const TensorView& residual_out, const TensorView& mean, const TensorView& rstd,
                             const TensorView* weight, const TensorView* grad_input,
                             const TensorView* grad_weight, const TensorView* grad_bias, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_layer_norm_backward");
  norm_backward("add_layer_norm_backward", false, grad_output, "residual_out", residual_out, 1, &mean, rstd, weight, 0.0,
                grad_residual_out, grad_input, grad_weight, grad_bias, stream);
}

void add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView* weight, double eps,
                  const TensorView& out, const TensorView& residual_out, const TensorView* rstd,
                  cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_rms_norm");
  norm_forward("add_rms_norm", true, input, 1, weight, nullptr, eps, 0.0, out, nullptr, rstd, {&residual, &residual_out},
               stream);
}

void add_rms_norm_backward(const TensorView* grad_output, const TensorView* grad_residual_out,
                           const TensorView& residual_out, const TensorView& rstd, const TensorView* weight,
                           const TensorView* grad_input, const TensorView* grad_weight, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_rms_norm_backward");
  norm_backward("add_rms_norm_backward", true, grad_output, "residual_out", residual_out, 1, nullptr, rstd, weight, 0.0,
                grad_residual_out, grad_input, grad_weight, nullptr, stream);
}

void rms_norm_float8(const TensorView& input, const TensorView* residual, const TensorView* weight, double eps,
                     double weight_offset, const TensorView& out, const TensorView* residual_out,
                     const TensorView* rstd, const NormFloat8& f8, cudaStream_t stream) {
  constexpr const char* op = "rms_norm_float8";
  runtime::NvtxRange range("tessera::rms_norm_float8");
  if ((residual == nullptr) != (residual_out == nullptr))
    detail::throw_arg(ErrorKind::value, op, residual ? "residual_out" : "residual",
                      "given with the other (both or neither)", "None");
  detail::check_cuda_tensor(op, "out", out);
  if (out.ndim < 1 || !out.is_contiguous())
    detail::throw_arg(ErrorKind::value, op, "out", "a contiguous tensor of at least 1 dimension (quantized as [M, K])",
                      detail::dims(out) + (out.is_contiguous() ? "" : " (not contiguous)"));
  TensorView flat = out;  // out as [M, K]
  flat.ndim = 2;
  flat.shape[1] = out.shape[out.ndim - 1];
  flat.shape[0] = product(out.shape, 0, out.ndim - 1);
  flat.strides[1] = 1, flat.strides[0] = flat.shape[1];
  float8::check_outputs(op, "out", flat, &f8.q, &f8.scale, f8.q_t, f8.scale_t, f8.granularity);
  for (const auto& [name, t] : {std::pair{"q", &f8.q}, {"scale", &f8.scale}, {"q_t", f8.q_t}, {"scale_t", f8.scale_t}}) {
    if (!t) continue;
    for (const auto& [other, o] : {std::pair{"input", &input}, {"residual", residual}, {"weight", weight},
                                   {"residual_out", residual_out}, {"rstd", rstd}})
      if (o) detail::check_no_overlap(op, name, *t, other, *o, false);
  }
  const bool tensor = f8.granularity == Float8Granularity::tensor;
  const int64_t words = tensor ? 1 : flat.shape[0] + flat.shape[1];
  runtime::DeviceGuard guard(out.device.index);
  runtime::Scratch amax(size_t(words) * sizeof(uint32_t), stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(amax.data(), 0, size_t(words) * sizeof(uint32_t), stream));
  Float8Sink sink{amax.as<uint32_t>(), !tensor};
  norm_forward(op, true, input, 1, weight, nullptr, eps, weight_offset, out, nullptr, rstd, {residual, residual_out},
               stream, &sink);
  if (sink.fused) float8::quantize_given_maxima(flat, &f8.q, &f8.scale, f8.q_t, f8.scale_t, f8.granularity,
                                                sink.amax, stream);
  else float8_quantize(flat, f8.q, f8.scale, f8.q_t, f8.scale_t, f8.granularity, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// The norm family, layer | rms x plain | add: each row a forward and its backward, from one
// template. The plain norms take a normalized shape (the library its length); the add ops
// normalize the last dimension, and their backward's grad_input is the gradient of both input and
// residual. Statistics (mean, rstd) are float32 of the leading shape, saved for the backward.
struct NormRow {
  bool rms, add;
  const char* summary;
  const char* backward_summary;
  const char* torch;
  void (*forward)(const char*, const Arg*, cudaStream_t);
  void (*backward)(const char*, const Arg*, cudaStream_t);
};

template <auto Fn>
constexpr auto kCall = &detail::Invoke<Fn, decltype(Fn)>::call;

std::string joined(const std::vector<std::string>& v) {
  std::string r;
  for (const std::string& s : v) r += (r.empty() ? "" : ", ") + s;
  return r;
}

void describe_norm(const NormRow& r) {
  const std::string name = std::string(r.add ? "add_" : "") + (r.rms ? "rms_norm" : "layer_norm");
  const std::string x = r.add ? "residual_out" : "input";  // what the backward normalizes
  const std::vector<std::string> stats = r.rms ? std::vector<std::string>{"rstd"} : std::vector<std::string>{"mean", "rstd"};
  const std::vector<std::string> params = r.rms ? std::vector<std::string>{"weight"} : std::vector<std::string>{"weight", "bias"};
  const std::string eps = r.rms ? "1.1920928955078125e-07" : "1e-05";  // torch's defaults
  const bool offset = r.rms && !r.add;  // Gemma's weight_offset: the plain rms_norm's

  std::vector<std::string> args = {"Tensor input", r.add ? "Tensor residual" : "int[] normalized_shape"};
  for (const std::string& p : params) args.push_back("Tensor? " + p + "=None");
  args.push_back("float eps=" + eps);
  if (offset) args.push_back("float weight_offset=0.0");
  std::vector<std::string> kparams = {"input", r.add ? "residual" : "normalized_shape"};
  kparams.insert(kparams.end(), params.begin(), params.end());
  kparams.push_back("eps");
  if (offset) kparams.push_back("weight_offset");
  std::vector<OpDesc::Output> outs = {out::like("out", "input")};
  if (r.add) outs.push_back(out::like("residual_out", "input"));
  for (const std::string& s : stats)
    outs.push_back(r.add ? out::stats(s, "input", 1) : out::stats(s, "input", "normalized_shape"));
  for (const OpDesc::Output& o : outs) kparams.push_back(o.param);
  const size_t n_out = outs.size();

  // backward(grad_output, [grad_residual_out,] x, [normalized_shape,] stats, params, output_mask[, weight_offset])
  // The add ops' grad_output may be None (only residual_out's gradient came): no parameter gradients.
  std::vector<std::string> bargs = {r.add ? "Tensor? grad_output" : "Tensor grad_output"}, bparams = {"grad_output"},
                           from = {"grad"};
  if (r.add) bargs.push_back("Tensor? grad_residual_out"), bparams.push_back("grad_residual_out"), from.push_back("grad1");
  bargs.push_back("Tensor " + x), bparams.push_back(x), from.push_back(r.add ? "result1" : "input");
  if (!r.add) bargs.push_back("int[] normalized_shape"), bparams.push_back("normalized_shape"), from.push_back("normalized_shape");
  for (size_t i = 0; i < stats.size(); ++i) {
    bargs.push_back("Tensor " + stats[i]), bparams.push_back(stats[i]);
    from.push_back("result" + std::to_string(n_out - stats.size() + i));
  }
  for (const std::string& p : params) bargs.push_back("Tensor? " + p), from.push_back(p);
  bparams.push_back("weight");  // the library takes the weight, not the bias
  bargs.push_back("bool[" + std::to_string(params.size() + 1) + "] output_mask"), from.push_back("mask");
  if (offset) bargs.push_back("float weight_offset=0.0"), bparams.push_back("weight_offset"), from.push_back("weight_offset");
  std::vector<OpDesc::Output> bouts = {out::like("grad_input", x).when("output_mask", 0)};
  for (size_t i = 0; i < params.size(); ++i) {
    OpDesc::Output g = out::like("grad_" + params[i], params[i]).when("output_mask", static_cast<int>(i) + 1);
    bouts.push_back(r.add ? std::move(g).if_given("grad_output") : std::move(g));
  }
  for (const OpDesc::Output& o : bouts) bparams.push_back(o.param);
  std::vector<std::string> grads = {r.add ? "input residual" : "input"};
  grads.insert(grads.end(), params.begin(), params.end());
  std::string returns = "(Tensor";
  for (size_t i = 1; i < n_out; ++i) returns += ", Tensor";
  std::string breturns = "(Tensor";
  for (size_t i = 1; i < bouts.size(); ++i) breturns += ", Tensor";

  describe fwd(name, "rowwise", r.summary);
  fwd.d.schemas = {name + "(" + joined(args) + ") -> " + returns + ")"};
  fwd.d.params = kparams;
  fwd.d.outputs = outs;
  fwd.d.call = r.forward;
  if (!r.add) fwd.d.trailing = {{"normalized_shape", "input"}};
  fwd.d.backward = name + "_backward";
  fwd.d.backward_args = from;
  fwd.d.grads = grads;
  if (r.torch) fwd.d.torch_function = r.torch;
  OpRegistrar{std::move(fwd)};

  describe bwd(name + "_backward", "rowwise", r.backward_summary);
  bwd.d.schemas = {name + "_backward(" + joined(bargs) + ") -> " + breturns + ")"};
  bwd.d.params = bparams;
  bwd.d.outputs = bouts;
  bwd.d.call = r.backward;
  if (!r.add) bwd.d.trailing = {{"normalized_shape", x}};
  bwd.d.float32_args = stats;
  OpRegistrar{std::move(bwd)};
}

const bool kNorms = [] {
  const NormRow rows[] = {
      {false, false, "LayerNorm over the trailing dimensions, as torch.nn.functional.layer_norm",
       "LayerNorm backward: grad_in, grad_weight, grad_bias (deterministic)", "torch.nn.functional.layer_norm",
       kCall<&layer_norm>, kCall<&layer_norm_backward>},
      {true, false, "RMSNorm over the trailing dimensions, as torch.nn.functional.rms_norm",
       "RMSNorm backward: grad_in, grad_weight (deterministic)", "torch.nn.functional.rms_norm", kCall<&rms_norm>,
       kCall<&rms_norm_backward>},
      {false, true, "residual_out = input + residual, then LayerNorm of it over the last dimension",
       "add_layer_norm backward: grad_input (of input and residual), grad_weight, grad_bias (deterministic)",
       nullptr, kCall<&add_layer_norm>, kCall<&add_layer_norm_backward>},
      {true, true, "residual_out = input + residual, then RMSNorm of it over the last dimension",
       "add_rms_norm backward: grad_input (of input and residual), grad_weight (deterministic)", nullptr,
       kCall<&add_rms_norm>, kCall<&add_rms_norm_backward>},
  };
  for (const NormRow& r : rows) describe_norm(r);
  return true;
}();
}  // namespace
}  // namespace tessera
