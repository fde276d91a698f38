// matmul's host launcher: argument checks, the views resolved into GemmArgs (sizes and element
// strides, a 2-d operand shared across batches by a batch stride of 0), and the tier choice.
// The kernels are in gemm_*.cu.
#include <string>

#include "ops/matrix/gemm.cuh"
#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/scratch.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/ops/matrix.hpp"
#include "tessera/op.hpp"

namespace tessera {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
    case Activation::silu: return "silu";
    case Activation::swiglu: return "swiglu";
    case Activation::geglu: return "geglu";
    default: return "none";
  }
}

namespace {

void check_rank(const char* op, const char* arg, const TensorView& t) {
  if (t.ndim != 2 && t.ndim != 3)
    detail::throw_arg(ErrorKind::value, op, arg, "a 2-d or 3-d tensor", detail::dims(t));
}

// Batch stride of a 2-d or 3-d operand: 0 when 2-d (shared) or when its batch dimension is 1.
int64_t batch_stride(const TensorView& t) { return t.ndim == 3 && t.shape[0] != 1 ? t.strides[0] : 0; }

void check_batch(const char* op, const char* arg, const TensorView& t, int64_t batch) {
  if (t.ndim == 3 && t.shape[0] != batch && t.shape[0] != 1)
    detail::throw_arg(ErrorKind::value, op, arg,
                      "a batch of " + std::to_string(batch) + " (or 1, or 2-d: shared)", detail::dims(t));
}

// The dtype checks of matmul (16-bit or float32 inputs; out of their dtype or float32) and
// scaled_mm (float8 inputs; out bfloat16, float16 or float32).
void check_dtypes(const char* op, const TensorView& a, const TensorView& b, const TensorView& c) {
  const bool fp8 = std::string(op) == "scaled_mm";
  if (fp8) detail::check_dtype_in(op, "input", a, {DType::float8_e4m3fn, DType::float8_e5m2});
  else detail::check_dtype_in(op, "input", a, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_same_dtype(op, "other", b, "input", a);
  if (fp8) detail::check_dtype_in(op, "out", c, {DType::bfloat16, DType::float16, DType::float32});
  else if (c.dtype != a.dtype && c.dtype != DType::float32)
    detail::throw_arg(ErrorKind::type, op, "out",
                      std::string("dtype ") + dtype_name(a.dtype) + " (that of 'input') or float32",
                      dtype_name(c.dtype));
}

// A device scalar multiplying alpha: float32, one element, on the device of `like`.
void check_scale(const char* op, const char* arg, const TensorView& s, const TensorView& like) {
  detail::check_cuda_tensor(op, arg, s);
  detail::check_same_device(op, arg, s, "input", like);
  detail::check_dtype_in(op, arg, s, {DType::float32});
  if (s.numel() != 1) detail::throw_arg(ErrorKind::value, op, arg, "one element", s.shape_str());
}

// scaled_mm's scales, float32 on the input's device, as torch._scaled_mm takes them: both of one
// element (per-tensor); scale_a [M, 1] and scale_b [1, N], contiguous (row-wise: one per row of
// input, one per column of other); or scale_a [M, ceil(K / 128)] and scale_b
// [ceil(K / 128), ceil(N / 128)] or [ceil(K / 128), N], any strides (block-wise: one per 1 x 128
// block of input's rows, one per 128 x 128 block of other or per 1 x 128 block of its columns,
// for e4m3). Kinds mixed are refused, as torch refuses them.
// Sets g's kind of scales and their pointers.
void set_scales(matrix::GemmArgs& g, const TensorView& a, const TensorView& b, const TensorView& sa,
                const TensorView& sb) {
  const char* op = "scaled_mm";
  for (auto [arg, s] : {std::pair{"scale_a", &sa}, std::pair{"scale_b", &sb}}) {
    detail::check_cuda_tensor(op, arg, *s);
    detail::check_same_device(op, arg, *s, "input", a);
    detail::check_dtype_in(op, arg, *s, {DType::float32});
  }
  g.scale_a = static_cast<const float*>(sa.data), g.scale_b = static_cast<const float*>(sb.data);
  if (sa.numel() == 1 && sb.numel() == 1) return;
  const int64_t m = a.shape[0], n = b.shape[1], k = a.shape[1];
  const int64_t kb = (k + matrix::kScaleBlock - 1) / matrix::kScaleBlock, nb = (n + matrix::kScaleBlock - 1) / matrix::kScaleBlock;
  const auto shaped = [](const TensorView& s, int64_t rows, int64_t cols) {
    return s.ndim == 2 && s.shape[0] == rows && s.shape[1] == cols;
  };
  const bool rows_a = shaped(sa, m, 1) && sa.is_contiguous(), cols_b = shaped(sb, 1, n) && sb.is_contiguous();
  if (rows_a && cols_b) {
    g.scale_rowwise = true;
    return;
  }
  if (shaped(sa, m, kb) && (shaped(sb, kb, nb) || shaped(sb, kb, n))) {
    if (a.dtype != DType::float8_e4m3fn)
      detail::throw_arg(ErrorKind::type, op, "input", "float8_e4m3fn with block-wise scales", dtype_name(a.dtype));
    g.scale_blockwise = true, g.sb_columns = !shaped(sb, kb, nb);
    g.sa_sm = sa.strides[0], g.sa_sk = sa.strides[1], g.sb_sk = sb.strides[0], g.sb_sn = sb.strides[1];
    return;
  }
  const auto dims = [](int64_t r, int64_t c) { return "[" + std::to_string(r) + ", " + std::to_string(c) + "]"; };
  const auto got = [&](const TensorView& s, bool fits) {
    return s.shape_str() + (fits && !s.is_contiguous() ? " (not contiguous)" : "");
  };
  detail::throw_arg(ErrorKind::value, op, rows_a || sa.numel() == 1 || shaped(sa, m, kb) ? "scale_b" : "scale_a",
                    "both of one element (per-tensor); 'scale_a' " + dims(m, 1) + " and 'scale_b' " + dims(1, n) +
                        ", contiguous (row-wise); or 'scale_a' " + dims(m, kb) + " and 'scale_b' " + dims(kb, nb) +
                        " or " + dims(kb, n) + " (block-wise: 1 x 128 blocks, and 128 x 128 or 1 x 128); not two kinds",
                    "'scale_a' " + got(sa, shaped(sa, m, 1)) + " and 'scale_b' " + got(sb, shaped(sb, 1, n)));
}

// The product's shape for an output `out` of N / 2 columns: out's with N columns.
TensorView widened(const TensorView& out, void* data) {
  int64_t shape[kMaxDims];
  for (int d = 0; d < out.ndim; ++d) shape[d] = out.shape[d];
  shape[out.ndim - 1] *= 2;
  return TensorView::make(data, out.dtype, shape, nullptr, out.ndim, out.device);
}

// With a gated activation (swiglu, geglu), out has N / 2 columns and the pre-activation output N
// (matmul_gated checks the rest first).
matrix::GemmArgs resolve(const char* kOp, const TensorView& a, const TensorView& b,
                         const TensorView& c, const MatmulOptions& o) {
  for (auto [arg, t] : {std::pair{"input", &a}, std::pair{"other", &b}, std::pair{"out", &c}}) {
    detail::check_cuda_tensor(kOp, arg, *t);
    check_rank(kOp, arg, *t);
  }
  check_dtypes(kOp, a, b, c);
  detail::check_same_device(kOp, "other", b, "input", a);
  detail::check_same_device(kOp, "out", c, "input", a);
  const int64_t m = a.shape[a.ndim - 2], k = a.shape[a.ndim - 1];
  const int64_t n = b.shape[b.ndim - 1];
  const bool gated = is_gated(o.activation);
  const int64_t out_n = gated ? n / 2 : n;
  if (b.shape[b.ndim - 2] != k)
    detail::throw_arg(ErrorKind::value, kOp, "other",
                      "K = " + std::to_string(k) + " rows (the columns of 'input' " +
                          a.shape_str() + ")",
                      b.shape_str());
  const int64_t batch = c.ndim == 3 ? c.shape[0] : 1;
  if (c.ndim == 2 && (a.ndim == 3 || b.ndim == 3) && std::max(a.ndim == 3 ? a.shape[0] : 1,
                                                              b.ndim == 3 ? b.shape[0] : 1) != 1)
    detail::throw_arg(ErrorKind::value, kOp, "out", "a 3-d tensor (the inputs are batched)", detail::dims(c));
  if (c.shape[c.ndim - 2] != m || c.shape[c.ndim - 1] != out_n)
    detail::throw_arg(ErrorKind::value, kOp, "out",
                      "[..., " + std::to_string(m) + ", " + std::to_string(out_n) + "] (M of 'input', " +
                          (gated ? "N / 2" : "N") + " of 'other')",
                      c.shape_str());
  check_batch(kOp, "input", a, batch);
  check_batch(kOp, "other", b, batch);
  detail::check_no_internal_overlap(kOp, "out", c);
  detail::check_no_overlap(kOp, "out", c, "input", a, false);
  detail::check_no_overlap(kOp, "out", c, "other", b, false);

  matrix::GemmArgs g;
  g.dtype = a.dtype, g.out_dtype = c.dtype;
  g.a = a.data, g.b = b.data, g.c = c.data;
  g.m = m, g.n = n, g.k = k, g.batch = batch;
  g.a_sb = batch_stride(a), g.a_sm = a.strides[a.ndim - 2], g.a_sk = a.strides[a.ndim - 1];
  g.b_sb = batch_stride(b), g.b_sk = b.strides[b.ndim - 2], g.b_sn = b.strides[b.ndim - 1];
  g.c_sb = c.ndim == 3 ? c.strides[0] : 0, g.c_sm = c.strides[c.ndim - 2], g.c_sn = c.strides[c.ndim - 1];
  // A dimension of size 1 may carry any stride; the kernels' layout tests want it canonical.
  if (k == 1) g.a_sk = 1, g.b_sk = 1;
  if (m == 1) g.a_sm = k;
  if (n == 1) g.b_sn = k;

  if (o.bias) {
    const TensorView& bias = *o.bias;
    detail::check_cuda_tensor(kOp, "bias", bias);
    detail::check_same_device(kOp, "bias", bias, "out", c);
    detail::check_same_dtype(kOp, "bias", bias, "out", c);
    if (bias.ndim != 1 || bias.shape[0] != n)
      detail::throw_arg(ErrorKind::value, kOp, "bias", "shape [" + std::to_string(n) + "] (N)",
                        bias.shape_str());
    g.bias = bias.data, g.bias_sn = bias.strides[0];
  }
  if (o.residual) {
    const TensorView& r = *o.residual;
    detail::check_cuda_tensor(kOp, "residual", r);
    detail::check_same_device(kOp, "residual", r, "out", c);
    detail::check_same_dtype(kOp, "residual", r, "out", c);
    const bool shape_ok = r.ndim == c.ndim && r.shape[r.ndim - 2] == m && r.shape[r.ndim - 1] == n &&
                          (r.ndim == 2 || r.shape[0] == batch || r.shape[0] == 1);
    if (!shape_ok)
      detail::throw_arg(ErrorKind::value, kOp, "residual", "shape " + c.shape_str() + " (that of 'out')",
                        r.shape_str());
    detail::check_no_overlap(kOp, "out", c, "residual", r, true);
    g.residual = r.data;
    g.r_sb = r.ndim == 3 && r.shape[0] != 1 ? r.strides[0] : 0;
    g.r_sm = r.strides[r.ndim - 2], g.r_sn = r.strides[r.ndim - 1];
  }
  if (o.preactivation) {
    const TensorView& z = *o.preactivation;
    detail::check_like(kOp, "preactivation", z, "out", gated ? widened(c, c.data) : c);
    detail::check_no_internal_overlap(kOp, "preactivation", z);
    detail::check_no_overlap(kOp, "preactivation", z, "out", c, false);
    detail::check_no_overlap(kOp, "preactivation", z, "input", a, false);
    detail::check_no_overlap(kOp, "preactivation", z, "other", b, false);
    if (o.residual) detail::check_no_overlap(kOp, "preactivation", z, "residual", *o.residual, false);
    g.z = z.data;
    g.z_sb = z.ndim == 3 ? z.strides[0] : 0, g.z_sm = z.strides[z.ndim - 2], g.z_sn = z.strides[z.ndim - 1];
  }
  if (o.scale) {
    check_scale(kOp, "scale", *o.scale, a);
    g.scale_a = static_cast<const float*>(o.scale->data);
  }
  g.alpha = float(o.alpha), g.beta = float(o.beta);
  g.activation = o.activation;
  g.allow_tf32 = o.allow_tf32;
  g.device = a.device.index;
  return g;
}

matrix::GemmCtx context(int device) {
  const cudaDeviceProp& props = runtime::device_props(device);
  return {props.multiProcessorCount, props.major};
}

void run(const char* op, matrix::GemmArgs& g, cudaStream_t stream) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  runtime::DeviceGuard guard(g.device);
  const matrix::GemmCtx ctx = context(g.device);
  g.config = matrix::tuned_config(op, g, ctx, stream);
  matrix::run_gemm(op, g, ctx, stream);
}

}  // namespace

void matrix::run_gemm(const char* op, const GemmArgs& g, const GemmCtx& ctx, cudaStream_t stream) {
  runtime::run_first<GemvTier, SkinnyTier, Sm90Tier, RelayoutTier, Sm80Tier, SimtTier>(op, g, ctx, stream);
}

namespace {

// Whether a gated activation runs in the sm90 tier's epilogue (only the N / 2 outputs written, and
// the product only where the pre-activation output asks for it): that tier takes the call, the
// product would go to it anyway (the GEMV and skinny tiers stream few rows' weight faster, and then the
// activation's pass over the product is small), and no other tier is forced (tests and measurements of that tier).
bool fused(const matrix::GemmArgs& g, const matrix::GemmCtx& ctx) {
  matrix::GemmArgs product = g;
  product.activation = Activation::none;
  const std::string forced = runtime::forced_tier("matmul");
  return (forced.empty() || forced == matrix::Sm90Tier::kName) &&
         !matrix::GemvTier::can_implement(product, ctx) && !matrix::SkinnyTier::can_implement(product, ctx) &&
         matrix::Sm90Tier::can_implement(g, ctx);
}

// scaled_mm's scales (set_scales), for the calls that share matmul's paths; none for matmul.
struct Scales {
  const TensorView* a = nullptr;
  const TensorView* b = nullptr;
};

// resolve(), then the scales where there are some.
matrix::GemmArgs resolve_scaled(const char* op, const TensorView& a, const TensorView& b, const TensorView& c,
                                const MatmulOptions& o, const Scales& scales) {
  matrix::GemmArgs g = resolve(op, a, b, c, o);
  if (scales.a) set_scales(g, a, b, *scales.a, *scales.b);
  return g;
}

// activation 'swiglu' or 'geglu': fused where the sm90 tier takes it; elsewhere the product (plus
// bias) into the pre-activation output (a scratch buffer where none is asked for), then the gated
// activation over it.
void matmul_gated(const char* op, const TensorView& input, const TensorView& other, const TensorView& out,
                  const MatmulOptions& options, const Scales& scales, cudaStream_t stream) {
  const std::string with = std::string("with activation '") + activation_name(options.activation) + "'";
  if (options.residual) detail::throw_arg(ErrorKind::value, op, "residual", "none " + with, "a tensor");
  if (options.beta != 0.0) detail::throw_arg(ErrorKind::value, op, "beta", "0 " + with, std::to_string(options.beta));
  detail::check_cuda_tensor(op, "out", out);
  check_rank(op, "out", out);
  detail::check_cuda_tensor(op, "other", other);
  check_rank(op, "other", other);
  const int64_t n = other.shape[other.ndim - 1];
  if (n % 2 != 0)
    detail::throw_arg(ErrorKind::value, op, "other",
                      "N even " + with + " (gate and up in blocks of 64 features)",
                      other.shape_str());
  if (out.shape[out.ndim - 1] * 2 != n)
    detail::throw_arg(ErrorKind::value, op, "out", "N / 2 = " + std::to_string(n / 2) + " columns " + with,
                      out.shape_str());
  if (options.preactivation) {
    const TensorView& z = *options.preactivation;
    const TensorView want = widened(out, nullptr);
    bool same = z.ndim == want.ndim;
    for (int d = 0; same && d < z.ndim; ++d) same = z.shape[d] == want.shape[d];
    if (!same)
      detail::throw_arg(ErrorKind::value, op, "preactivation", want.shape_str() + " (out's, with N columns)",
                        z.shape_str());
  }
  matrix::GemmArgs g = resolve_scaled(op, input, other, out, options, scales);  // every other check
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  runtime::DeviceGuard guard(g.device);
  if (fused(g, context(g.device))) return run(op, g, stream);
  runtime::Scratch buf;
  TensorView z;
  if (options.preactivation) {
    z = *options.preactivation;
  } else {
    buf = runtime::Scratch(out.nbytes() * 2, stream);
    z = widened(out, buf.data());
  }
  MatmulOptions o = options;
  o.activation = Activation::none, o.preactivation = nullptr;
  matrix::GemmArgs product = resolve_scaled(op, input, other, z, o, scales);
  run(op, product, stream);
  if (options.activation == Activation::geglu) geglu_blocks(z, out, stream);
  else swiglu(z, out, stream);
}

}  // namespace

void matmul(const TensorView& input, const TensorView& other, const TensorView& out,
            const MatmulOptions& options, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::matmul");
  if (is_gated(options.activation)) return matmul_gated("matmul", input, other, out, options, {}, stream);
  matrix::GemmArgs g = resolve("matmul", input, other, out, options);
  run("matmul", g, stream);
}

void scaled_mm(const TensorView& input, const TensorView& other, const TensorView& scale_a,
               const TensorView& scale_b, const TensorView& out, const ScaledMmOptions& options,
               cudaStream_t stream) {
  runtime::NvtxRange range("tessera::scaled_mm");
  for (auto [arg, t] : {std::pair{"input", &input}, std::pair{"other", &other}, std::pair{"out", &out}})
    if (t->ndim != 2)
      detail::throw_arg(ErrorKind::value, "scaled_mm", arg, "a 2-d tensor", detail::dims(*t));
  MatmulOptions o;
  o.bias = options.bias, o.beta = options.beta, o.residual = options.residual;
  o.activation = options.activation, o.preactivation = options.preactivation;
  const Scales scales{&scale_a, &scale_b};
  if (is_gated(o.activation)) return matmul_gated("scaled_mm", input, other, out, o, scales, stream);
  matrix::GemmArgs g = resolve_scaled("scaled_mm", input, other, out, o, scales);
  if (g.scale_blockwise && options.beta != 0.0)
    detail::throw_arg(ErrorKind::value, "scaled_mm", "beta", "0 with block-wise scales", std::to_string(options.beta));
  run("scaled_mm", g, stream);
}

void scaled_mm(const TensorView& input, const TensorView& other, const TensorView& scale_a,
               const TensorView& scale_b, const TensorView& out, const TensorView* bias,
               cudaStream_t stream) {
  ScaledMmOptions o;
  o.bias = bias;
  scaled_mm(input, other, scale_a, scale_b, out, o, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
// Output shapes from two operands and an epilogue: torch kernels written by hand
// (python/src/torch/matrix.cpp). input [M, K] or [B, M, K], other [K, N] or [B, K, N] (the
// library's operands; the Python layer views torch.matmul's shapes as these). allow_tf32=None:
// torch's float32 matmul precision, read at each call (also in a compiled graph).
// matmul.preactivation: the output and the pre-activation product
// (alpha * input @ other + bias) from one kernel, what the autograd forward keeps for the
// activation's backward.
const OpRegistrar kMatmul = describe("matmul", "matrix", "GEMM with a fused epilogue: activation(alpha * A @ B + bias) + residual + beta * C")
    .schema("matmul(Tensor input, Tensor other, *, Tensor? bias=None, Tensor? residual=None, "
            "str activation='none', float alpha=1, ScalarType? out_dtype=None, bool? allow_tf32=None) -> Tensor")
    .schema("matmul.preactivation(Tensor input, Tensor other, *, Tensor? bias=None, Tensor? residual=None, "
            "str activation='none', float alpha=1, ScalarType? out_dtype=None, bool? allow_tf32=None) "
            "-> (Tensor, Tensor)")
    .torch("torch.matmul");
const OpRegistrar kScaledMm = describe("scaled_mm", "matrix", "float8 GEMM with per-tensor, row-wise or block-wise scales "
                                       "(torch._scaled_mm): out[i, j] = scale_a[i] * scale_b[j] * (A @ B)[i, j] + bias[j], "
                                       "scale_a of one element or [M, 1], scale_b of one element or [1, N] (both one kind); "
                                       "or block-wise (e4m3), scale_a [M, K / 128] and scale_b [K / 128, N / 128] or [K / 128, N] "
                                       "(1 x 128 blocks, and 128 x 128 or 1 x 128), each block's sums scaled in float32; "
                                       "then matmul's epilogue: activation (swiglu, geglu: N / 2 columns) and residual")
    .schema("scaled_mm(Tensor input, Tensor other, Tensor scale_a, Tensor scale_b, *, Tensor? bias=None, "
            "ScalarType? out_dtype=None, Tensor? residual=None, str activation='none') -> Tensor")
    .dtypes({DType::float8_e4m3fn, DType::float8_e5m2});
}  // namespace
}  // namespace tessera
