// The matrix family as torch ops: matmul (the library's 2-d/3-d operands; the Python layer views
// torch.matmul's shapes as these), scaled_mm, float8_quantize, grouped_mm and mlp (its autograd
// recomputes the hidden activation from the saved pre-activation). Schemas: the descriptions'
// (src/ops/matrix/matmul.cu, float8_quantize.cu, mlp.cu).
#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "binding.hpp"
#include "fast.hpp"

namespace tessera::torch_ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

Activation activation_of(c10::string_view name, const char* op = "matmul") {
  for (Activation a : kActivations)
    if (name == activation_name(a)) return a;
  TORCH_CHECK_VALUE(false, "tessera.", op, ": argument 'activation': expected None, 'relu', 'gelu', "
                    "'gelu_tanh', 'silu', 'swiglu' or 'geglu', got '", std::string(name), "'");
}

// torch.get_float32_matmul_precision() != "highest", as torch.matmul reads it, unless given.
bool tf32_of(std::optional<bool> allow_tf32) {
  return allow_tf32.value_or(at::globalContext().float32MatmulPrecision() != at::Float32MatmulPrecision::HIGHEST);
}

// input [M, K] or [B, M, K] @ other [K, N] or [B, K, N]: [M, N] or [B, M, N]. Other ranks get a
// 0-d stand-in, which the library refuses after naming the operand at fault.
std::vector<int64_t> product_shape(const at::Tensor& a, const at::Tensor& b) {
  const int64_t da = a.dim(), db = b.dim();
  if (da < 2 || da > 3 || db < 2 || db > 3) return {};
  const int64_t m = a.size(-2), n = b.size(-1);
  if (da == 2 && db == 2) return {m, n};
  // A batch of 1 (or a 2-d operand) is shared by the other's batches.
  return {std::max(da == 3 ? a.size(0) : 1, db == 3 ? b.size(0) : 1), m, n};
}

// The product into a new output and, where `preactivation`, a second new tensor receiving the
// product before the activation (MatmulOptions::preactivation).
at::Tensor matmul_into(const at::Tensor& input, const at::Tensor& other, const OptTensor& bias,
                       const OptTensor& residual, c10::string_view activation, double alpha,
                       std::optional<at::ScalarType> out_dtype, std::optional<bool> allow_tf32,
                       at::Tensor* preactivation) {
  MatmulOptions o;
  o.activation = activation_of(activation);
  o.alpha = alpha;
  o.allow_tf32 = tf32_of(allow_tf32);
  TensorView b, r;
  const TensorView a = view("matmul", "input", input), bv = view("matmul", "other", other);
  o.bias = optional_view("matmul", "bias", bias, b);
  o.residual = optional_view("matmul", "residual", residual, r);
  const auto options = input.options().dtype(out_dtype.value_or(input.scalar_type()));
  std::vector<int64_t> shape = product_shape(input, other);
  const std::vector<int64_t> product = shape;
  if (is_gated(o.activation) && !shape.empty()) shape.back() /= 2;  // the library checks N
  at::Tensor out = at::empty(shape, options);
  TensorView z;
  if (preactivation) {
    *preactivation = at::empty(product, options);
    z = view("matmul", "preactivation", *preactivation);
    o.preactivation = &z;
  }
  guarded([&] { tessera::matmul(a, bv, view("matmul", "out", out), o, stream_of(input)); });
  return out;
}

at::Tensor matmul(const at::Tensor& input, const at::Tensor& other, const OptTensor& bias,
                  const OptTensor& residual, c10::string_view activation, double alpha,
                  std::optional<at::ScalarType> out_dtype, std::optional<bool> allow_tf32) {
  return matmul_into(input, other, bias, residual, activation, alpha, out_dtype, allow_tf32, nullptr);
}

std::tuple<at::Tensor, at::Tensor> matmul_preactivation(
    const at::Tensor& input, const at::Tensor& other, const OptTensor& bias, const OptTensor& residual,
    c10::string_view activation, double alpha, std::optional<at::ScalarType> out_dtype,
    std::optional<bool> allow_tf32) {
  at::Tensor z;
  at::Tensor out = matmul_into(input, other, bias, residual, activation, alpha, out_dtype, allow_tf32, &z);
  return {out, z};
}

// scaled_mm: out [M, N] (N / 2 with a gated activation) of out_dtype, bfloat16 by default.
at::Tensor scaled_mm(const at::Tensor& input, const at::Tensor& other, const at::Tensor& scale_a,
                     const at::Tensor& scale_b, const OptTensor& bias,
                     std::optional<at::ScalarType> out_dtype, const OptTensor& residual,
                     c10::string_view activation) {
  const char* op = "scaled_mm";
  TensorView b, r;
  const TensorView a = view(op, "input", input), bv = view(op, "other", other);
  const TensorView sa = view(op, "scale_a", scale_a), sb = view(op, "scale_b", scale_b);
  ScaledMmOptions o;
  o.bias = optional_view(op, "bias", bias, b);
  o.residual = optional_view(op, "residual", residual, r);
  o.activation = activation_of(activation, op);
  const bool ok = input.dim() == 2 && other.dim() == 2;
  const int64_t n = ok ? (is_gated(o.activation) ? other.size(1) / 2 : other.size(1)) : 0;
  at::Tensor out = at::empty(ok ? std::vector<int64_t>{input.size(0), n} : std::vector<int64_t>{},
                             input.options().dtype(out_dtype.value_or(at::kBFloat16)));
  guarded([&] { tessera::scaled_mm(a, bv, sa, sb, view(op, "out", out), o, stream_of(input)); });
  return out;
}

// The float8 copies of a 2-d input [M, K] (an input not 2-d gets 0-d stand-ins, which the library
// refuses after naming the input): q [M, K] and scale where `rows`, q_t [K, M] and scale_t where
// `columns`, in that order, the scales' shapes tessera::float8_scale_shapes'.
std::vector<at::Tensor> float8_outputs(const at::Tensor& input, Float8Granularity g, bool columns, bool rows) {
  const bool flat = input.dim() == 2;
  const int64_t m = flat ? input.size(0) : 0, k = flat ? input.size(1) : 0;
  const auto f8 = input.options().dtype(at::kFloat8_e4m3fn), f32 = input.options().dtype(at::kFloat);
  const auto shape = [&](std::vector<int64_t> s) { return flat ? s : std::vector<int64_t>{}; };
  const Float8ScaleShapes scales = float8_scale_shapes(m, k, g);
  std::vector<at::Tensor> out;
  if (rows) out = {at::empty(shape({m, k}), f8), at::empty(shape(scales.scale), f32)};
  if (columns) {
    out.push_back(at::empty(shape({k, m}), f8));
    out.push_back(at::empty(shape(scales.scale_t), f32));
  }
  return out;
}

// float8_quantize: q [M, K] float8_e4m3fn and scale (tessera::float8_scale_shapes: [M, 1]
// row-wise, 0-d per tensor, [M, K / 128] and [M / 128, K / 128] by blocks, as
// tessera.float8.quantize gives them); .columns also x's columns transposed, q_t [K, M], and
// scale_t; .transposed (rows false) those alone. An input not 2-d gets 0-d stand-ins, which the
// library refuses after naming the input.
// With `up` (float8_quantize_gated): input is the gate and the product act(gate) * up is quantized,
// rows always.
std::vector<at::Tensor> float8_quantize_into(const at::Tensor& input, c10::string_view granularity, bool columns,
                                             bool rows, const at::Tensor* up = nullptr,
                                             c10::string_view activation = "silu") {
  const char* op = up ? "float8_quantize_gated" : "float8_quantize";
  const TensorView x = view(op, up ? "gate" : "input", input);
  const Activation act = up ? activation_of(activation, op) : Activation::none;
  TensorView u;
  if (up) u = view(op, "up", *up);
  Float8Granularity g = Float8Granularity::row;
  guarded([&] { parse(op, std::string_view(granularity.data(), granularity.size()), g); });
  std::vector<at::Tensor> out = float8_outputs(input, g, columns, rows);
  TensorView qt, st;
  if (columns) qt = view(op, "q_t", out[rows ? 2 : 0]), st = view(op, "scale_t", out[rows ? 3 : 1]);
  guarded([&] {
    if (up)
      tessera::float8_quantize_gated(x, u, act, view(op, "q", out[0]), view(op, "scale", out[1]),
                                     columns ? &qt : nullptr, columns ? &st : nullptr, g, stream_of(input));
    else if (rows)
      tessera::float8_quantize(x, view(op, "q", out[0]), view(op, "scale", out[1]), columns ? &qt : nullptr,
                               columns ? &st : nullptr, g, stream_of(input));
    else
      tessera::float8_quantize_transposed(x, qt, st, g, stream_of(input));
  });
  return out;
}

// rms_norm_float8 (tessera.float8.rms_norm's and add_rms_norm's kernels): x [..., H] normalized
// into y (with a residual, the sum written into residual_out and normalized), rstd, and y as
// [M, H] quantized into q and scale (with columns, q_t and scale_t too): (y, residual_out, rstd, q,
// scale, q_t, scale_t), undefined tensors for what is not asked for. No autograd: its Function
// (python/tessera/_float8_producers.py) records the call.
std::vector<at::Tensor> rms_norm_float8_into(const at::Tensor& input, const at::Tensor* residual, const at::Tensor& weight,
                                             double eps, double weight_offset, c10::string_view granularity,
                                             bool columns) {
  const char* op = "rms_norm_float8";
  Float8Granularity g = Float8Granularity::row;
  guarded([&] { parse(op, std::string_view(granularity.data(), granularity.size()), g); });
  const int64_t k = input.dim() ? input.size(-1) : 0;
  const at::Tensor flat = input.dim() && k ? input.reshape({-1, k}) : input;
  at::Tensor y = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor s = residual ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor();
  at::Tensor rstd = at::empty(input.dim() ? input.sizes().slice(0, input.dim() - 1) : at::IntArrayRef{},
                              input.options().dtype(at::kFloat));
  std::vector<at::Tensor> q = float8_outputs(flat, g, columns, true);
  TensorView qt, st, rv, sv;
  if (columns) qt = view(op, "q_t", q[2]), st = view(op, "scale_t", q[3]);
  if (residual) rv = view(op, "residual", *residual), sv = view(op, "residual_out", s);
  const TensorView wv = view(op, "weight", weight), rs = view(op, "rstd", rstd);
  const TensorView qv = view(op, "q", q[0]), sc = view(op, "scale", q[1]);
  const NormFloat8 f8{qv, sc, columns ? &qt : nullptr, columns ? &st : nullptr, g};
  guarded([&] {
    tessera::rms_norm_float8(view(op, "input", input), residual ? &rv : nullptr, &wv, eps, weight_offset,
                             view(op, "out", y), residual ? &sv : nullptr, &rs, f8, stream_of(input));
  });
  return {y, s, rstd, q[0], q[1], columns ? q[2] : at::Tensor(), columns ? q[3] : at::Tensor()};
}

// float8_quantize_gated_backward: grad_gate and grad_up of act(gate) * up from grad_output, each
// with its float8 copies (rows and columns): (grad_gate, grad_up, q, scale, q_t, scale_t of
// grad_gate, the same of grad_up). No autograd: a backward calls it.
std::vector<at::Tensor> float8_quantize_gated_backward_into(const at::Tensor& grad_output, const at::Tensor& gate,
                                                            const at::Tensor& up, c10::string_view activation,
                                                            c10::string_view granularity) {
  const char* op = "float8_quantize_gated_backward";
  const Activation act = activation_of(activation, op);
  Float8Granularity g = Float8Granularity::row;
  guarded([&] { parse(op, std::string_view(granularity.data(), granularity.size()), g); });
  std::vector<at::Tensor> out = {at::empty_like(grad_output, at::MemoryFormat::Contiguous),
                                 at::empty_like(grad_output, at::MemoryFormat::Contiguous)};
  for (int i = 0; i < 2; ++i) {
    std::vector<at::Tensor> copy = float8_outputs(grad_output, g, true, true);
    out.insert(out.end(), copy.begin(), copy.end());
  }
  const char* names[8] = {"q_gate", "scale_gate", "q_t_gate", "scale_t_gate", "q_up", "scale_up", "q_t_up", "scale_t_up"};
  TensorView v[8];
  for (int i = 0; i < 8; ++i) v[i] = view(op, names[i], out[2 + i]);
  guarded([&] {
    tessera::float8_quantize_gated_backward(view(op, "grad_output", grad_output), view(op, "gate", gate),
                                            view(op, "up", up), act, view(op, "grad_gate", out[0]),
                                            view(op, "grad_up", out[1]), Float8Copy{v[0], v[1], &v[2], &v[3]},
                                            Float8Copy{v[4], v[5], &v[6], &v[7]}, g, stream_of(grad_output));
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> float8_quantize(const at::Tensor& input, c10::string_view granularity) {
  auto o = float8_quantize_into(input, granularity, false, true);
  return {o[0], o[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> float8_quantize_columns(const at::Tensor& input,
                                                                                   c10::string_view granularity) {
  auto o = float8_quantize_into(input, granularity, true, true);
  return {o[0], o[1], o[2], o[3]};
}

std::tuple<at::Tensor, at::Tensor> float8_quantize_transposed(const at::Tensor& input, c10::string_view granularity) {
  auto o = float8_quantize_into(input, granularity, true, false);
  return {o[0], o[1]};
}

// float8_quantize_gated (and .columns): act(gate) * up quantized as float8_quantize (and .columns)
// quantize input.
std::tuple<at::Tensor, at::Tensor> float8_quantize_gated(const at::Tensor& gate, const at::Tensor& up,
                                                         c10::string_view activation, c10::string_view granularity) {
  auto o = float8_quantize_into(gate, granularity, false, true, &up, activation);
  return {o[0], o[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> float8_quantize_gated_columns(
    const at::Tensor& gate, const at::Tensor& up, c10::string_view activation, c10::string_view granularity) {
  auto o = float8_quantize_into(gate, granularity, true, true, &up, activation);
  return {o[0], o[1], o[2], o[3]};
}

// grouped_mm's output: [M, N] where one operand is 2-d and the other 3-d, [G, M, N] where both are
// 3-d or both 2-d (G: offs's length); other ranks a 0-d stand-in, which the library refuses.
std::vector<int64_t> grouped_shape(const at::Tensor& a, const at::Tensor& b, const OptTensor& offs) {
  const int64_t da = a.dim(), db = b.dim();
  if (da < 2 || da > 3 || db < 2 || db > 3) return {};
  const int64_t m = a.size(-2), n = b.size(-1);
  if (da != db) return {m, n};
  if (da == 3) return {a.size(0), m, n};
  return {offs && offs->dim() == 1 ? offs->size(0) : 0, m, n};
}

at::Tensor grouped_mm(const at::Tensor& input, const at::Tensor& other, const OptTensor& offs,
                      std::optional<at::ScalarType> out_dtype) {
  const char* op = "grouped_mm";
  TensorView o;
  const TensorView a = view(op, "input", input), bv = view(op, "other", other);
  const TensorView* op_offs = optional_view(op, "offs", offs, o);
  at::Tensor out = at::empty(grouped_shape(input, other, offs), input.options().dtype(out_dtype.value_or(input.scalar_type())));
  guarded([&] { tessera::grouped_mm(a, bv, op_offs, view(op, "out", out), stream_of(input)); });
  return out;
}

using GroupedSig = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, std::optional<at::ScalarType>);

// Every gradient of a grouped product is a grouped product of the other form over the same
// offsets (grouped_mm.cu's forms): rows (a 2-d, b 3-d): da rows, db depth; columns (a 3-d, b
// 2-d): da depth, db columns; depth (both 2-d): da columns, db rows; batched: batched.
// A 3-d tensor whose last two dimensions are a transposed view of contiguous memory.
bool stored_transposed(const at::Tensor& t) {
  return t.dim() == 3 && t.size(-1) > 1 && t.size(-2) > 1 && t.transpose(-2, -1).is_contiguous();
}

struct GroupedMmFunction : torch::autograd::Function<GroupedMmFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& other,
                            const OptTensor& offs, std::optional<at::ScalarType> out_dtype) {
    static const auto op = handle<GroupedSig>("grouped_mm");
    ctx->save_for_backward({input, other, offs.value_or(at::Tensor())});
    return call_below_autograd(op, input, other, offs, out_dtype);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = handle<GroupedSig>("grouped_mm");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    const OptTensor offs = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    const at::Tensor g = grads[0].to(a.scalar_type());
    at::Tensor da, db;
    // A 3-d operand stored transposed (the experts' weights as nn.Linear keeps them, [G, N, K]
    // viewed as [G, K, N]) gets its gradient in its own layout, from the transposed product
    // (db^T = g^T a, da^T = b g^T): a gradient of another layout would be copied into it.
    if (ctx->needs_input_grad(0))
      da = stored_transposed(a) ? op.call(b, g.transpose(-2, -1), offs, a.scalar_type()).transpose(-2, -1)
                                : op.call(g, b.transpose(-2, -1), offs, a.scalar_type());
    if (ctx->needs_input_grad(1))
      db = stored_transposed(b) ? op.call(g.transpose(-2, -1), a, offs, b.scalar_type()).transpose(-2, -1)
                                : op.call(a.transpose(-2, -1), g, offs, b.scalar_type());
    return {da, db, at::Tensor(), at::Tensor()};
  }
};

at::Tensor grouped_mm_autograd(const at::Tensor& input, const at::Tensor& other, const OptTensor& offs,
                               std::optional<at::ScalarType> out_dtype) {
  static const auto op = handle<GroupedSig>("grouped_mm");
  if (!records(input, other)) return call_below_autograd(op, input, other, offs, out_dtype);
  return GroupedMmFunction::apply(input, other, offs, out_dtype);
}

// The rows of t: the product of its dimensions but the last.
int64_t rows_of(const at::Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) rows *= t.size(d);
  return rows;
}

std::vector<int64_t> with_last(const at::Tensor& t, int64_t cols) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape.back() = cols;
  return shape;
}

// input [..., K], its leading dimensions flattened into rows for the library (a view where they
// flatten in place); out [..., D] and, where `preactivation`, the first product [..., N]. The
// hidden activation goes to a workspace from torch's allocator, freed on return.
at::Tensor mlp_into(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out,
                    c10::string_view activation, std::optional<bool> allow_tf32, at::Tensor* preactivation) {
  const char* op = "mlp";
  MlpOptions o;
  o.activation = activation_of(activation, op);
  o.allow_tf32 = tf32_of(allow_tf32);
  TORCH_CHECK_VALUE(input.dim() >= 1, "tessera.mlp: argument 'input': expected at least 1 dimension, got a 0-d tensor");
  const int64_t rows = rows_of(input), k = input.size(-1);
  const at::Tensor flat = input.reshape({rows, k});  // kept: a copy where the rows do not flatten
  const TensorView x = view(op, "input", flat);
  const TensorView wi = view(op, "w_in", w_in), wo = view(op, "w_out", w_out);
  // Shapes from 2-d weights; otherwise 0-d stand-ins, which the library refuses after naming the
  // weight at fault.
  const bool ok = w_in.dim() == 2 && w_out.dim() == 2;
  const int64_t n = ok ? w_in.size(0) : 0, d = ok ? w_out.size(0) : 0;
  const int64_t hidden = is_gated(o.activation) ? n / 2 : n;
  const auto options = input.options();
  at::Tensor out = at::empty(ok ? with_last(input, d) : std::vector<int64_t>{}, options);
  const at::Tensor h = at::empty({rows * hidden}, options);
  const TensorView hv = view(op, "hidden", h);
  o.hidden = &hv;
  TensorView z;
  if (preactivation) {
    *preactivation = at::empty(ok ? with_last(input, n) : std::vector<int64_t>{}, options);
    z = view(op, "preactivation", ok ? preactivation->view({rows, n}) : *preactivation);
    o.preactivation = &z;
  }
  const TensorView y = view(op, "out", ok ? out.view({rows, d}) : out);
  guarded([&] { tessera::mlp(x, wi, wo, y, o, stream_of(input)); });
  return out;
}

at::Tensor mlp(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out,
               c10::string_view activation, std::optional<bool> allow_tf32) {
  return mlp_into(input, w_in, w_out, activation, allow_tf32, nullptr);
}

std::tuple<at::Tensor, at::Tensor> mlp_preactivation(const at::Tensor& input, const at::Tensor& w_in,
                                                     const at::Tensor& w_out, c10::string_view activation,
                                                     std::optional<bool> allow_tf32) {
  at::Tensor z;
  at::Tensor out = mlp_into(input, w_in, w_out, activation, allow_tf32, &z);
  return {out, z};
}

// ---- autograd ---------------------------------------------------------------------------------

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using MatmulSig = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                             c10::string_view, double, std::optional<at::ScalarType>,
                             std::optional<bool>);

const c10::TypedOperatorHandle<MatmulSig>& matmul_op() {
  static const auto h = handle<MatmulSig>("matmul");
  return h;
}

using PreactivationSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&, c10::string_view,
    double, std::optional<at::ScalarType>, std::optional<bool>);

at::Tensor activate_backward(const at::Tensor& g, const at::Tensor& z, Activation a) {
  static const auto gelu = handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>(
      "gelu_backward");
  static const auto silu = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("silu_backward");
  static const auto swiglu = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("swiglu_backward");
  static const auto geglu = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("geglu_blocks_backward");
  switch (a) {
    case Activation::swiglu: return swiglu.call(g, z);
    case Activation::geglu: return geglu.call(g, z);
    case Activation::relu: return g.mul(z.gt(0));
    case Activation::gelu: return gelu.call(g, z, "none");
    case Activation::gelu_tanh: return gelu.call(g, z, "tanh");
    case Activation::silu: return silu.call(g, z);
    default: return g;
  }
}

// A gradient of the product's batch shape summed to an operand's: over the batch for a 2-d
// (shared) operand, keeping a batch of 1.
at::Tensor sum_to_operand(const at::Tensor& g, at::IntArrayRef shape) {
  if (g.sizes() == shape) return g;
  if (shape.size() == 2) return g.sum(0);
  return g.sum(0, /*keepdim=*/true);
}

// out = activation(alpha * input @ other + bias) + residual, the whole epilogue fused. With an
// activation the kernel also stores the pre-activation product, which the backward reads.
struct MatmulFunction : torch::autograd::Function<MatmulFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& other,
                            const OptTensor& bias, const OptTensor& residual,
                            c10::string_view activation, double alpha,
                            std::optional<at::ScalarType> out_dtype, std::optional<bool> allow_tf32) {
    static const auto with_preactivation = handle<PreactivationSig>("matmul", "preactivation");
    at::Tensor y, z;
    if (activation_of(activation) == Activation::none)
      y = call_below_autograd(matmul_op(), input, other, bias, residual, activation, alpha, out_dtype,
                              allow_tf32);
    else
      std::tie(y, z) = call_below_autograd(with_preactivation, input, other, bias, residual,
                                           activation, alpha, out_dtype, allow_tf32);
    ctx->save_for_backward({input, other, z});
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["allow_tf32"] = allow_tf32;
    ctx->saved_data["bias"] = bias && bias->defined();
    ctx->saved_data["residual"] = residual && residual->defined() ? residual->sizes().vec()
                                                                 : std::vector<int64_t>{};
    return y;
  }

  // dZ = dY through the activation; dA = alpha dZ B^T, dB = alpha A^T dZ (one product over the
  // flattened batch where B is shared), dbias = the sum of dZ over rows, dresidual = dY.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1], &z = saved[2];
    const Activation act = activation_of(ctx->saved_data["activation"].toStringRef());
    const double alpha = ctx->saved_data["alpha"].toDouble();
    const auto tf32 = ctx->saved_data["allow_tf32"].toOptional<bool>();
    const bool has_bias = ctx->saved_data["bias"].toBool();
    const auto residual = ctx->saved_data["residual"].toIntVector();
    const at::Tensor g = grads[0].contiguous();
    const at::Tensor dz = activate_backward(g, z, act);
    size_t edge = 2;  // needs_input_grad counts the tensors given: input, other, bias?, residual?
    const bool want_bias = has_bias && ctx->needs_input_grad(edge++);
    const bool want_residual = !residual.empty() && ctx->needs_input_grad(edge);
    at::Tensor da, db, dbias, dres;
    if (ctx->needs_input_grad(0))
      da = sum_to_operand(matmul_op().call(dz.to(b.scalar_type()), b.transpose(-1, -2), {}, {},
                                           "none", alpha, a.scalar_type(), tf32),
                          a.sizes());
    if (ctx->needs_input_grad(1)) {
      if (b.dim() == 2 && (a.dim() == 3 || b.stride(0) == 1)) {
        const int64_t k = a.size(-1), n = dz.size(-1);
        const at::Tensor a2 = a.reshape({-1, k}), dz2 = dz.reshape({-1, n}).to(a.scalar_type());
        // A column-major other (linear's weight.T) gets its gradient in its own layout, dB^T = dZ^T
        // A, so that autograd hands the weight a gradient of the weight's strides, with no copy.
        if (b.stride(0) == 1 && b.size(0) > 1)
          db = matmul_op().call(dz2.transpose(0, 1), a2, {}, {}, "none", alpha, b.scalar_type(), tf32).t();
        else
          db = matmul_op().call(a2.transpose(0, 1), dz2, {}, {}, "none", alpha, b.scalar_type(), tf32);
      } else {
        db = sum_to_operand(matmul_op().call(a.transpose(-1, -2), dz.to(a.scalar_type()), {}, {}, "none",
                                             alpha, b.scalar_type(), tf32),
                            b.sizes());
      }
    }
    if (want_bias) dbias = dz.reshape({-1, dz.size(-1)}).sum(0);
    if (want_residual) dres = sum_to_operand(g, residual);
    return {da, db, dbias, dres, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor matmul_autograd(const at::Tensor& input, const at::Tensor& other, const OptTensor& bias,
                           const OptTensor& residual, c10::string_view activation, double alpha,
                           std::optional<at::ScalarType> out_dtype, std::optional<bool> allow_tf32) {
  if (!records(input, other, bias, residual))
    return call_below_autograd(matmul_op(), input, other, bias, residual, activation, alpha,
                               out_dtype, allow_tf32);
  return MatmulFunction::apply(input, other, bias, residual, activation, alpha, out_dtype, allow_tf32);
}

// The hidden activation h = activation(z) and the gradient through it dz = activation'(z) dh, each
// only where wanted: for the gated activations both from one pass over z (swiglu_backward.recompute,
// geglu_blocks_backward.recompute); for the others the forward's and the backward's elementwise ops.
std::pair<at::Tensor, at::Tensor> recompute(const at::Tensor& dh, const at::Tensor& z, Activation a, bool want_h,
                                            bool want_dz) {
  using Recompute = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&);
  static const auto swiglu = handle<Recompute>("swiglu_backward", "recompute");
  static const auto geglu = handle<Recompute>("geglu_blocks_backward", "recompute");
  static const auto gelu = handle<at::Tensor(const at::Tensor&, c10::string_view)>("gelu");
  static const auto silu = handle<at::Tensor(const at::Tensor&)>("silu");
  if (is_gated(a) && want_h) {
    auto [dz, h] = (a == Activation::geglu ? geglu : swiglu).call(dh, z);
    return {h, dz};
  }
  at::Tensor h;
  if (want_h) {
    switch (a) {
      case Activation::relu: h = z.relu(); break;
      case Activation::gelu: h = gelu.call(z, "none"); break;
      case Activation::gelu_tanh: h = gelu.call(z, "tanh"); break;
      case Activation::silu: h = silu.call(z); break;
      default: h = z;
    }
  }
  return {h, want_dz ? activate_backward(dh, z, a) : at::Tensor()};
}

using MlpPreactivationSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                const at::Tensor&, c10::string_view,
                                                                std::optional<bool>);

// y = activation(x w_in^T) w_out^T, saving x, the weights and z = x w_in^T, not h = activation(z):
// the backward recomputes h from z, as torch.compile's partitioner does for two linears.
struct MlpFunction : torch::autograd::Function<MlpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& w_in,
                            const at::Tensor& w_out, c10::string_view activation, std::optional<bool> allow_tf32) {
    static const auto with_preactivation = handle<MlpPreactivationSig>("mlp", "preactivation");
    auto [y, z] = call_below_autograd(with_preactivation, input, w_in, w_out, activation, allow_tf32);
    ctx->save_for_backward({input, w_in, w_out, z});
    ctx->saved_data["activation"] = std::string(activation);
    ctx->saved_data["allow_tf32"] = allow_tf32;
    return y;
  }

  // Over rows (the leading dimensions flattened): dh = dy w_out; h and dz = activation'(z) dh from
  // z; dw_out = dy^T h, dw_in = dz^T x (each in its weight's row-major layout, the product's
  // first operand a transposed view), dx = dz w_in. dh and h are dropped as soon as they are read.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w_in = saved[1], &w_out = saved[2], &z = saved[3];
    const Activation act = activation_of(ctx->saved_data["activation"].toStringRef(), "mlp");
    const auto tf32 = ctx->saved_data["allow_tf32"].toOptional<bool>();
    const bool want_x = ctx->needs_input_grad(0), want_w_in = ctx->needs_input_grad(1);
    const bool want_w_out = ctx->needs_input_grad(2);
    // Sizes as SymInts: under torch.compile with dynamic shapes they are symbols.
    c10::SymInt rows = 1;
    for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.sym_size(d);
    const auto flat = [&](const at::Tensor& t) { return t.reshape_symint({rows, t.sym_size(-1)}); };
    const at::Tensor g = flat(grads[0].to(x.scalar_type()).contiguous());
    at::Tensor dh = matmul_op().call(g, w_out, {}, {}, "none", 1.0, x.scalar_type(), tf32);
    auto [h, dz] = recompute(dh, flat(z), act, want_w_out, want_x || want_w_in);
    dh.reset();
    at::Tensor dx, dw_in, dw_out;
    if (want_w_out) dw_out = matmul_op().call(g.t(), h, {}, {}, "none", 1.0, w_out.scalar_type(), tf32);
    h.reset();
    if (want_w_in) dw_in = matmul_op().call(dz.t(), flat(x), {}, {}, "none", 1.0, w_in.scalar_type(), tf32);
    if (want_x)
      dx = matmul_op().call(dz, w_in, {}, {}, "none", 1.0, x.scalar_type(), tf32).reshape_symint(x.sym_sizes());
    return {dx, dw_in, dw_out, at::Tensor(), at::Tensor()};
  }
};

at::Tensor mlp_autograd(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out,
                        c10::string_view activation, std::optional<bool> allow_tf32) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, c10::string_view,
                                           std::optional<bool>)>("mlp");
  if (!records(input, w_in, w_out)) return call_below_autograd(op, input, w_in, w_out, activation, allow_tf32);
  return MlpFunction::apply(input, w_in, w_out, activation, allow_tf32);
}

void kernels(torch::Library& m) {
  m.impl("matmul", &matmul);
  m.impl("matmul.preactivation", &matmul_preactivation);
  m.impl("scaled_mm", &scaled_mm);
  m.impl("float8_quantize", &float8_quantize);
  m.impl("float8_quantize.columns", &float8_quantize_columns);
  m.impl("float8_quantize.transposed", &float8_quantize_transposed);
  m.impl("float8_quantize_gated", &float8_quantize_gated);
  m.impl("float8_quantize_gated.columns", &float8_quantize_gated_columns);
  m.impl("grouped_mm", &grouped_mm);
  m.impl("mlp", &mlp);
  m.impl("mlp.preactivation", &mlp_preactivation);
}

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)
TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  m.impl("matmul", &tessera::torch_ops::matmul_autograd);
  m.impl("mlp", &tessera::torch_ops::mlp_autograd);
  m.impl("grouped_mm", &tessera::torch_ops::grouped_mm_autograd);
}

namespace tessera::torch_ops::fast {
at::Tensor matmul(const at::Tensor& input, const at::Tensor& other,
                  const std::optional<at::Tensor>& bias) {
  return torch_ops::matmul(input, other, bias, std::nullopt, "none", 1.0, std::nullopt, std::nullopt);
}
at::Tensor mlp(const at::Tensor& input, const at::Tensor& w_in, const at::Tensor& w_out, c10::string_view activation) {
  return torch_ops::mlp(input, w_in, w_out, activation, std::nullopt);
}
at::Tensor scaled_mm(const at::Tensor& input, const at::Tensor& other, const at::Tensor& scale_a,
                     const at::Tensor& scale_b, std::optional<at::ScalarType> out_dtype) {
  return torch_ops::scaled_mm(input, other, scale_a, scale_b, std::nullopt, out_dtype, std::nullopt, "none");
}
std::vector<at::Tensor> float8_quantize(const at::Tensor& input, c10::string_view granularity, bool columns,
                                        bool rows) {
  return torch_ops::float8_quantize_into(input, granularity, columns, rows);
}
std::vector<at::Tensor> float8_quantize_gated(const at::Tensor& gate, const at::Tensor& up,
                                              c10::string_view activation, c10::string_view granularity,
                                              bool columns) {
  return torch_ops::float8_quantize_into(gate, granularity, columns, true, &up, activation);
}
std::vector<at::Tensor> rms_norm_float8(const at::Tensor& input, const at::Tensor* residual, const at::Tensor& weight,
                                        double eps, double weight_offset, c10::string_view granularity, bool columns) {
  return torch_ops::rms_norm_float8_into(input, residual, weight, eps, weight_offset, granularity, columns);
}
std::vector<at::Tensor> float8_quantize_gated_backward(const at::Tensor& grad_output, const at::Tensor& gate,
                                                       const at::Tensor& up, c10::string_view activation,
                                                       c10::string_view granularity) {
  return torch_ops::float8_quantize_gated_backward_into(grad_output, gate, up, activation, granularity);
}
}  // namespace tessera::torch_ops::fast
