// LayerNorm and RMSNorm (torch's semantics; see tessera/ops/rowwise.hpp), and the same fused with
// a residual add (add_layer_norm, add_rms_norm): argument checks, layouts, dtype dispatch and the
// public functions. The kernels and their tiers are in norm_forward.cu, norm_backward.cu and
// norm_staged.cu (norm.cuh says what bounds them).
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

void zero_fill(const TensorView& t, cudaStream_t stream) {
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    TESSERA_CUDA_CHECK(cudaMemsetAsync(t.data, 0, t.nbytes(), stream));
    return;
  }
  runtime::Scratch z;
  const TensorView c = contiguous_scratch(t, z, stream);
  TESSERA_CUDA_CHECK(cudaMemsetAsync(c.data, 0, c.nbytes(), stream));
  copy(c, t, stream);
}

void check_shape(const char* op, const char* arg, const TensorView& t, const int64_t* shape, int ndim,
                 const char* what) {
  bool same = t.ndim == ndim;
  for (int d = 0; same && d < ndim; ++d) same = t.shape[d] == shape[d];
  if (!same)
    detail::throw_arg(ErrorKind::value, op, arg,
                      "shape " + detail::shape_str(shape, ndim) + " (" + what + ")", t.shape_str());
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
  const std::string what = "the normalized shape of '" + std::string(xname) + "'";
  check_shape(op, arg, t, x.shape + lead, x.ndim - lead, what.c_str());
}

// mean, rstd: float32, the leading shape.
void check_stats(const char* op, const char* arg, const TensorView& t, const char* xname, const TensorView& x,
                 int lead) {
  detail::check_cuda_tensor(op, arg, t);
  detail::check_same_device(op, arg, t, xname, x);
  detail::check_dtype_in(op, arg, t, {DType::float32});
  const std::string what = "the leading shape of '" + std::string(xname) + "'";
  check_shape(op, arg, t, x.shape, lead, what.c_str());
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
  std::vector<Named> seen;
  for (const Named& o : outs) {
    if (!o.t) continue;
    detail::check_no_internal_overlap(op, o.name, *o.t);
    for (const Named& i : ins)
      if (i.t) detail::check_no_overlap(op, o.name, *o.t, i.name, *i.t, o.may_be && o.may_be == i.t);
    for (const Named& s : seen) detail::check_no_overlap(op, o.name, *o.t, s.name, *s.t, false);
    seen.push_back(o);
  }
}

// ---- the two drivers ---------------------------------------------------------------------------
// The add ops' residual: the forward's residual and residual_out; none for the plain norms.
struct Residual {
  const TensorView* in = nullptr;
  const TensorView* out = nullptr;
};

void norm_forward(const char* op, bool rms, const TensorView& x, int nnorm, const TensorView* weight,
                  const TensorView* bias, double eps, double w_offset, const TensorView& out,
                  const TensorView* mean, const TensorView* rstd, Residual res, cudaStream_t stream) {
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
  if (x.numel() == 0) return;

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
    norm::forward(op, p, rms, vec, norm::Ctx::of(x.device.index), stream);
  });
  copy_back(ov, &out, stream);
  if (res.out) copy_back(resov, res.out, stream);
  if (mean) copy_back(mv, mean, stream);
  if (rstd) copy_back(rv, rstd, stream);
}

// `xname`: the argument x is ('input'; the add ops' backward: 'residual_out'). `dres`: the add ops'
// gradient of residual_out, added to grad_in (nullptr: none).
void norm_backward(const char* op, bool rms, const TensorView& grad_out, const char* xname, const TensorView& x,
                   int nnorm, const TensorView* mean, const TensorView& rstd, const TensorView* weight,
                   double w_offset, const TensorView* dres, const TensorView* grad_in, const TensorView* grad_weight,
                   const TensorView* grad_bias, cudaStream_t stream) {
  check_x(op, xname, x, nnorm, std::string(xname) != "input");  // the add ops normalize the last dim
  const int lead = x.ndim - nnorm;
  detail::check_like(op, "grad_output", grad_out, xname, x);
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
                {{"grad_output", &grad_out}, {"grad_residual_out", dres}, {xname, &x}, {"mean", mean},
                 {"rstd", &rstd}, {"weight", weight}});
  if (!grad_in) dres = nullptr;  // nothing to add it to

  const int64_t rows = product(x.shape, 0, lead), n = product(x.shape, lead, x.ndim);
  const bool sums = grad_weight || grad_bias;
  if (n == 0 || (!grad_in && !sums) || (rows == 0 && !sums)) return;
  runtime::DeviceGuard guard(x.device.index);
  if (rows == 0) {  // column sums over no rows: zeros, as torch gives
    if (grad_weight) zero_fill(*grad_weight, stream);
    if (grad_bias) zero_fill(*grad_bias, stream);
    return;
  }

  runtime::Scratch xs, dys, dxs, ws, dws, dbs, ms, rs, drs, parts, means;
  const TensorView xv = as_input(x, lead, true, xs, stream);
  const TensorView dyv = as_input(grad_out, lead, true, dys, stream);
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
  norm_backward("layer_norm_backward", false, grad_out, "input", x, normalized_ndim, &mean, rstd, weight, 0.0,
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
  norm_backward("rms_norm_backward", true, grad_out, "input", x, normalized_ndim, nullptr, rstd, weight,
                weight_offset, nullptr, grad_in, grad_weight, nullptr, stream);
}

void add_layer_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                    const TensorView* bias, double eps, const TensorView& out, const TensorView& residual_out,
                    const TensorView* mean, const TensorView* rstd, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_layer_norm");
  norm_forward("add_layer_norm", false, input, 1, weight, bias, eps, 0.0, out, mean, rstd, {&residual, &residual_out},
               stream);
}

void add_layer_norm_backward(const TensorView& grad_output, const TensorView* grad_residual_out,
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

void add_rms_norm_backward(const TensorView& grad_output, const TensorView* grad_residual_out,
                           const TensorView& residual_out, const TensorView& rstd, const TensorView* weight,
                           const TensorView* grad_input, const TensorView* grad_weight, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::add_rms_norm_backward");
  norm_backward("add_rms_norm_backward", true, grad_output, "residual_out", residual_out, 1, nullptr, rstd, weight, 0.0,
                grad_residual_out, grad_input, grad_weight, nullptr, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// mean and rstd are float32 of the leading shape: torch kernels written by hand
// (python/src/torch/rowwise.cpp).
const OpRegistrar kLayerNorm = describe("layer_norm", "rowwise", "LayerNorm over the trailing dimensions, as torch.nn.functional.layer_norm")
    .schema("layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, "
            "float eps=1e-05) -> (Tensor, Tensor, Tensor)")
    .torch("torch.nn.functional.layer_norm");
const OpRegistrar kLayerNormBackward = describe("layer_norm_backward", "rowwise", "LayerNorm backward: grad_in, grad_weight, grad_bias (deterministic)")
    .schema("layer_norm_backward(Tensor grad_output, Tensor input, int[] normalized_shape, Tensor mean, "
            "Tensor rstd, Tensor? weight, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
const OpRegistrar kRmsNorm = describe("rms_norm", "rowwise", "RMSNorm over the trailing dimensions, as torch.nn.functional.rms_norm")
    .schema("rms_norm(Tensor input, int[] normalized_shape, Tensor? weight, float eps, "
            "float weight_offset=0.0) -> (Tensor, Tensor)")
    .torch("torch.nn.functional.rms_norm");
const OpRegistrar kRmsNormBackward = describe("rms_norm_backward", "rowwise", "RMSNorm backward: grad_in, grad_weight (deterministic)")
    .schema("rms_norm_backward(Tensor grad_output, Tensor input, int[] normalized_shape, Tensor rstd, "
            "Tensor? weight, bool[2] output_mask, float weight_offset=0.0) -> (Tensor, Tensor)");
// The residual add fused with the norm over the last dimension: (out, residual_out, [mean,] rstd).
// The backward's grad_input is the gradient of both input and residual.
const OpRegistrar kAddLayerNorm = describe("add_layer_norm", "rowwise", "residual_out = input + residual, then LayerNorm of it over the last dimension")
    .schema("add_layer_norm(Tensor input, Tensor residual, Tensor? weight=None, Tensor? bias=None, "
            "float eps=1e-05) -> (Tensor, Tensor, Tensor, Tensor)");
const OpRegistrar kAddLayerNormBackward = describe("add_layer_norm_backward", "rowwise", "add_layer_norm backward: grad_input (of input and residual), grad_weight, grad_bias (deterministic)")
    .schema("add_layer_norm_backward(Tensor grad_output, Tensor? grad_residual_out, Tensor residual_out, "
            "Tensor mean, Tensor rstd, Tensor? weight, bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
const OpRegistrar kAddRmsNorm = describe("add_rms_norm", "rowwise", "residual_out = input + residual, then RMSNorm of it over the last dimension")
    .schema("add_rms_norm(Tensor input, Tensor residual, Tensor? weight, float eps) -> (Tensor, Tensor, Tensor)");
const OpRegistrar kAddRmsNormBackward = describe("add_rms_norm_backward", "rowwise", "add_rms_norm backward: grad_input (of input and residual), grad_weight (deterministic)")
    .schema("add_rms_norm_backward(Tensor grad_output, Tensor? grad_residual_out, Tensor residual_out, "
            "Tensor rstd, Tensor? weight, bool[2] output_mask) -> (Tensor, Tensor)");
}  // namespace
}  // namespace tessera
