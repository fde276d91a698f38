// The row-wise family's torch kernels written by hand: layer_norm and rms_norm, add_layer_norm and
// add_rms_norm (and their backwards), whose statistics are float32 of the leading shape. Schemas:
// the descriptions' (src/ops/rowwise/norm.cu); softmax and log_softmax take the generic kernels
// (generic.cpp). mean and rstd are float32 tensors of the leading shape,
// input.shape[:-len(normalized_shape)] (the add ops: input.shape[:-1]).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "binding.hpp"
#include "fast.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = std::optional<at::Tensor>;
using Tensor4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;

// ---- layer_norm and rms_norm ----------------------------------------------------------------------

std::string shape_list(at::IntArrayRef s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// len(normalized_shape), after checking that it is the trailing part of input's shape.
int normalized_ndim(const char* op, const at::Tensor& input, at::IntArrayRef normalized) {
  const int64_t k = static_cast<int64_t>(normalized.size()), nd = input.dim();
  const bool ok = k > 0 && k <= nd && input.sizes().slice(nd - k) == normalized;
  TORCH_CHECK_VALUE(ok, "tessera.", op, ": argument 'normalized_shape': expected the trailing "
                    "dimensions of the input's shape ", shape_list(input.sizes()), " (",
                    nd ? "1 to " + std::to_string(nd) + " of them" : std::string("a 0-d input has none"),
                    "), got ", shape_list(normalized));
  return static_cast<int>(k);
}

// `count` float32 statistics of the leading shape; NaN where rows have no elements (their
// statistics are undefined and the library writes nothing).
std::vector<at::Tensor> new_stats(const at::Tensor& x, int k, int count) {
  const at::IntArrayRef lead = x.sizes().slice(0, x.dim() - k);
  std::vector<at::Tensor> stats;
  for (int i = 0; i < count; ++i) {
    stats.push_back(at::empty(lead, x.options().dtype(at::kFloat)));
    if (x.numel() == 0 && stats.back().numel() > 0) stats.back().fill_(NAN);
  }
  return stats;
}

// A parameter's gradient: the normalized shape, the parameter's dtype.
at::Tensor param_grad(const at::Tensor& x, int k, const OptTensor& like) {
  const auto dtype = like && like->defined() ? like->scalar_type() : x.scalar_type();
  return at::empty(x.sizes().slice(x.dim() - k), x.options().dtype(dtype));
}

// The forward; with `stats` false (the fast path: nothing will ask for them) no mean and rstd.
Tensor3 layer_norm_with(const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                        const OptTensor& bias, double eps, bool stats) {
  const char* op = "layer_norm";
  const int k = normalized_ndim(op, input, normalized_shape);
  TensorView w, b, mean, rstd;
  const TensorView x = view(op, "input", input);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  const TensorView* bp = optional_view(op, "bias", bias, b);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  const std::vector<at::Tensor> s = stats ? new_stats(input, k, 2) : std::vector<at::Tensor>{};
  guarded([&] {
    if (stats) mean = view(op, "mean", s[0]), rstd = view(op, "rstd", s[1]);
    tessera::layer_norm(x, k, wp, bp, eps, view(op, "out", out), stats ? &mean : nullptr,
                        stats ? &rstd : nullptr, stream_of(input));
  });
  return stats ? Tensor3{out, s[0], s[1]} : Tensor3{out, {}, {}};
}

Tensor3 layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                   const OptTensor& bias, double eps) {
  return layer_norm_with(input, normalized_shape, weight, bias, eps, true);
}

Tensor3 layer_norm_backward(const at::Tensor& grad_output, const at::Tensor& input,
                            at::IntArrayRef normalized_shape, const at::Tensor& mean,
                            const at::Tensor& rstd, const OptTensor& weight,
                            std::array<bool, 3> mask) {
  const char* op = "layer_norm_backward";
  const int k = normalized_ndim(op, input, normalized_shape);
  if (!mask[0] && !(mask[1] && weight && weight->defined()) && !mask[2]) return {};  // nothing wanted
  TensorView w, vi, vw, vb;
  const TensorView g = view(op, "grad_output", grad_output), x = view(op, "input", input);
  const TensorView vm = view(op, "mean", mean), vr = view(op, "rstd", rstd);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  at::Tensor gi, gw, gb;
  if (mask[0]) gi = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (mask[1] && weight && weight->defined()) gw = param_grad(input, k, weight);
  if (mask[2]) gb = param_grad(input, k, weight);
  guarded([&] {
    tessera::layer_norm_backward(g, x, k, vm, vr, wp, optional_view(op, "grad_input", gi, vi),
                                 optional_view(op, "grad_weight", gw, vw),
                                 optional_view(op, "grad_bias", gb, vb), stream_of(grad_output));
  });
  return {gi, gw, gb};
}

Tensor2 rms_norm_with(const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                      double eps, double weight_offset, bool stats) {
  const char* op = "rms_norm";
  const int k = normalized_ndim(op, input, normalized_shape);
  TensorView w, rstd;
  const TensorView x = view(op, "input", input);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  const std::vector<at::Tensor> s = stats ? new_stats(input, k, 1) : std::vector<at::Tensor>{};
  guarded([&] {
    if (stats) rstd = view(op, "rstd", s[0]);
    tessera::rms_norm(x, k, wp, eps, weight_offset, view(op, "out", out), stats ? &rstd : nullptr, stream_of(input));
  });
  return stats ? Tensor2{out, s[0]} : Tensor2{out, {}};
}

Tensor2 rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape, const OptTensor& weight,
                 double eps, double weight_offset) {
  return rms_norm_with(input, normalized_shape, weight, eps, weight_offset, true);
}

Tensor2 rms_norm_backward(const at::Tensor& grad_output, const at::Tensor& input,
                          at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                          const OptTensor& weight, std::array<bool, 2> mask, double weight_offset) {
  const char* op = "rms_norm_backward";
  const int k = normalized_ndim(op, input, normalized_shape);
  if (!mask[0] && !(mask[1] && weight && weight->defined())) return {};  // nothing wanted
  TensorView w, vi, vw;
  const TensorView g = view(op, "grad_output", grad_output), x = view(op, "input", input);
  const TensorView vr = view(op, "rstd", rstd);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  at::Tensor gi, gw;
  if (mask[0]) gi = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (mask[1] && weight && weight->defined()) gw = param_grad(input, k, weight);
  guarded([&] {
    tessera::rms_norm_backward(g, x, k, vr, wp, weight_offset, optional_view(op, "grad_input", gi, vi),
                               optional_view(op, "grad_weight", gw, vw), stream_of(grad_output));
  });
  return {gi, gw};
}

// ---- add_layer_norm and add_rms_norm ------------------------------------------------------------
// The residual add fused with the norm over the last dimension. A 0-d input has no last dimension:
// its allocations take none, and the library's check names it.
int last_ndim(const at::Tensor& t) { return t.dim() > 0 ? 1 : 0; }

// The forwards; with `stats` false (the fast path) no mean and rstd.
Tensor4 add_layer_norm_with(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight,
                            const OptTensor& bias, double eps, bool stats) {
  const char* op = "add_layer_norm";
  TensorView w, b, mean, rstd;
  const TensorView x = view(op, "input", input), r = view(op, "residual", residual);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  const TensorView* bp = optional_view(op, "bias", bias, b);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor res = at::empty_like(input, at::MemoryFormat::Contiguous);
  const std::vector<at::Tensor> s = stats ? new_stats(input, last_ndim(input), 2) : std::vector<at::Tensor>{};
  guarded([&] {
    if (stats) mean = view(op, "mean", s[0]), rstd = view(op, "rstd", s[1]);
    tessera::add_layer_norm(x, r, wp, bp, eps, view(op, "out", out), view(op, "residual_out", res),
                            stats ? &mean : nullptr, stats ? &rstd : nullptr, stream_of(input));
  });
  return stats ? Tensor4{out, res, s[0], s[1]} : Tensor4{out, res, {}, {}};
}

Tensor4 add_layer_norm(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight,
                       const OptTensor& bias, double eps) {
  return add_layer_norm_with(input, residual, weight, bias, eps, true);
}

Tensor3 add_rms_norm_with(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight, double eps,
                          bool stats) {
  const char* op = "add_rms_norm";
  TensorView w, rstd;
  const TensorView x = view(op, "input", input), r = view(op, "residual", residual);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor res = at::empty_like(input, at::MemoryFormat::Contiguous);
  const std::vector<at::Tensor> s = stats ? new_stats(input, last_ndim(input), 1) : std::vector<at::Tensor>{};
  guarded([&] {
    if (stats) rstd = view(op, "rstd", s[0]);
    tessera::add_rms_norm(x, r, wp, eps, view(op, "out", out), view(op, "residual_out", res),
                          stats ? &rstd : nullptr, stream_of(input));
  });
  return stats ? Tensor3{out, res, s[0]} : Tensor3{out, res, {}};
}

Tensor3 add_rms_norm(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight, double eps) {
  return add_rms_norm_with(input, residual, weight, eps, true);
}

// grad_input is the gradient of both input and residual: one tensor, returned once.
Tensor3 add_layer_norm_backward(const at::Tensor& grad_output, const OptTensor& grad_residual_out,
                                const at::Tensor& residual_out, const at::Tensor& mean, const at::Tensor& rstd,
                                const OptTensor& weight, std::array<bool, 3> mask) {
  const char* op = "add_layer_norm_backward";
  if (!mask[0] && !(mask[1] && weight && weight->defined()) && !mask[2]) return {};  // nothing wanted
  TensorView w, d, vi, vw, vb;
  const TensorView g = view(op, "grad_output", grad_output);
  const TensorView* dp = optional_view(op, "grad_residual_out", grad_residual_out, d);
  const TensorView x = view(op, "residual_out", residual_out);
  const TensorView vm = view(op, "mean", mean), vr = view(op, "rstd", rstd);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  const int k = last_ndim(residual_out);
  at::Tensor gi, gw, gb;
  if (mask[0]) gi = at::empty_like(residual_out, at::MemoryFormat::Contiguous);
  if (mask[1] && weight && weight->defined()) gw = param_grad(residual_out, k, weight);
  if (mask[2]) gb = param_grad(residual_out, k, weight);
  guarded([&] {
    tessera::add_layer_norm_backward(g, dp, x, vm, vr, wp, optional_view(op, "grad_input", gi, vi),
                                     optional_view(op, "grad_weight", gw, vw),
                                     optional_view(op, "grad_bias", gb, vb), stream_of(grad_output));
  });
  return {gi, gw, gb};
}

Tensor2 add_rms_norm_backward(const at::Tensor& grad_output, const OptTensor& grad_residual_out,
                              const at::Tensor& residual_out, const at::Tensor& rstd, const OptTensor& weight,
                              std::array<bool, 2> mask) {
  const char* op = "add_rms_norm_backward";
  if (!mask[0] && !(mask[1] && weight && weight->defined())) return {};  // nothing wanted
  TensorView w, d, vi, vw;
  const TensorView g = view(op, "grad_output", grad_output);
  const TensorView* dp = optional_view(op, "grad_residual_out", grad_residual_out, d);
  const TensorView x = view(op, "residual_out", residual_out);
  const TensorView vr = view(op, "rstd", rstd);
  const TensorView* wp = optional_view(op, "weight", weight, w);
  at::Tensor gi, gw;
  if (mask[0]) gi = at::empty_like(residual_out, at::MemoryFormat::Contiguous);
  if (mask[1] && weight && weight->defined()) gw = param_grad(residual_out, last_ndim(residual_out), weight);
  guarded([&] {
    tessera::add_rms_norm_backward(g, dp, x, vr, wp, optional_view(op, "grad_input", gi, vi),
                                   optional_view(op, "grad_weight", gw, vw), stream_of(grad_output));
  });
  return {gi, gw};
}

// The norms save input, the statistics and weight; their backward ops compute the gradients
// autograd asks for (output_mask), in one pass.
struct LayerNormFunction : torch::autograd::Function<LayerNormFunction> {
  static const auto& op() {
    static const auto h = handle<Tensor3(const at::Tensor&, at::IntArrayRef, const OptTensor&,
                                         const OptTensor&, double)>("layer_norm");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               std::vector<int64_t> normalized_shape, const OptTensor& weight,
                               const OptTensor& bias, double eps) {
    auto [out, mean, rstd] = call_below_autograd(op(), input, normalized_shape, weight, bias, eps);
    ctx->save_for_backward({input, mean, rstd, weight.value_or(at::Tensor())});
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);  // the statistics get no gradient: no zeros to fill
    return {out, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        handle<Tensor3(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                       const at::Tensor&, const OptTensor&, std::array<bool, 3>)>("layer_norm_backward");
    if (!grads[0].defined()) return variable_list(5);
    const auto saved = ctx->get_saved_variables();
    const OptTensor weight = saved[3].defined() ? OptTensor(saved[3]) : std::nullopt;
    const auto shape = ctx->saved_data["normalized_shape"].toIntVector();
    // needs_input_grad counts the tensor arguments that were given: input, weight?, bias?
    size_t edge = 1;
    const bool want_w = weight && ctx->needs_input_grad(edge++);
    const bool want_b = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(edge);
    auto [gi, gw, gb] = op.call(grads[0], saved[0], shape, saved[1], saved[2], weight,
                                {ctx->needs_input_grad(0), want_w, want_b});
    return {gi, at::Tensor(), gw, gb, at::Tensor()};
  }
};

struct RmsNormFunction : torch::autograd::Function<RmsNormFunction> {
  static const auto& op() {
    static const auto h =
        handle<Tensor2(const at::Tensor&, at::IntArrayRef, const OptTensor&, double, double)>("rms_norm");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input,
                               std::vector<int64_t> normalized_shape, const OptTensor& weight,
                               double eps, double weight_offset) {
    auto [out, rstd] = call_below_autograd(op(), input, normalized_shape, weight, eps, weight_offset);
    ctx->save_for_backward({input, rstd, weight.value_or(at::Tensor())});
    ctx->saved_data["normalized_shape"] = normalized_shape;
    ctx->saved_data["weight_offset"] = weight_offset;
    ctx->mark_non_differentiable({rstd});
    ctx->set_materialize_grads(false);
    return {out, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        handle<Tensor2(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                       const OptTensor&, std::array<bool, 2>, double)>("rms_norm_backward");
    if (!grads[0].defined()) return variable_list(5);
    const auto saved = ctx->get_saved_variables();
    const OptTensor weight = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    const auto shape = ctx->saved_data["normalized_shape"].toIntVector();
    // needs_input_grad counts the tensor arguments that were given: input, weight?
    auto [gi, gw] = op.call(grads[0], saved[0], shape, saved[1], weight,
                            {ctx->needs_input_grad(0), weight && ctx->needs_input_grad(1)},
                            ctx->saved_data["weight_offset"].toDouble());
    return {gi, at::Tensor(), gw, at::Tensor(), at::Tensor()};
  }
};

// The add ops save residual_out (their output), the statistics and weight. The backward gets the
// gradients of out and residual_out, either of which may be absent (materialize_grads off): with
// out's, one backward op adds residual_out's to the norm's gradient; with residual_out's alone,
// it passes to input and residual as it is. grad_input is returned for both input and residual.
// needs_input_grad counts the tensor arguments that were given: input, residual, weight?, bias?
struct AddLayerNormFunction : torch::autograd::Function<AddLayerNormFunction> {
  static const auto& op() {
    static const auto h = handle<Tensor4(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                                         double)>("add_layer_norm");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               const OptTensor& weight, const OptTensor& bias, double eps) {
    auto [out, res, mean, rstd] = call_below_autograd(op(), input, residual, weight, bias, eps);
    ctx->save_for_backward({res, mean, rstd, weight.value_or(at::Tensor())});
    ctx->saved_data["bias"] = bias.has_value() && bias->defined();
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);
    return {out, res, mean, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        handle<Tensor3(const at::Tensor&, const OptTensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                       const OptTensor&, std::array<bool, 3>)>("add_layer_norm_backward");
    const at::Tensor& dy = grads[0];
    const OptTensor dres = grads[1].defined() ? OptTensor(grads[1]) : std::nullopt;
    if (!dy.defined()) return {grads[1], grads[1], at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const OptTensor weight = saved[3].defined() ? OptTensor(saved[3]) : std::nullopt;
    size_t edge = 2;
    const bool want_w = weight && ctx->needs_input_grad(edge++);
    const bool want_b = ctx->saved_data["bias"].toBool() && ctx->needs_input_grad(edge);
    const bool want_in = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto [gi, gw, gb] = op.call(dy, dres, saved[0], saved[1], saved[2], weight, {want_in, want_w, want_b});
    return {gi, gi, gw, gb, at::Tensor()};
  }
};

struct AddRmsNormFunction : torch::autograd::Function<AddRmsNormFunction> {
  static const auto& op() {
    static const auto h =
        handle<Tensor3(const at::Tensor&, const at::Tensor&, const OptTensor&, double)>("add_rms_norm");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& residual,
                               const OptTensor& weight, double eps) {
    auto [out, res, rstd] = call_below_autograd(op(), input, residual, weight, eps);
    ctx->save_for_backward({res, rstd, weight.value_or(at::Tensor())});
    ctx->mark_non_differentiable({rstd});
    ctx->set_materialize_grads(false);
    return {out, res, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = handle<Tensor2(const at::Tensor&, const OptTensor&, const at::Tensor&, const at::Tensor&,
                                          const OptTensor&, std::array<bool, 2>)>("add_rms_norm_backward");
    const at::Tensor& dy = grads[0];
    const OptTensor dres = grads[1].defined() ? OptTensor(grads[1]) : std::nullopt;
    if (!dy.defined()) return {grads[1], grads[1], at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const OptTensor weight = saved[2].defined() ? OptTensor(saved[2]) : std::nullopt;
    const bool want_in = ctx->needs_input_grad(0) || ctx->needs_input_grad(1);
    auto [gi, gw] = op.call(dy, dres, saved[0], saved[1], weight, {want_in, weight && ctx->needs_input_grad(2)});
    return {gi, gi, gw, at::Tensor()};
  }
};

Tensor3 layer_norm_autograd(const at::Tensor& input, at::IntArrayRef normalized_shape,
                            const OptTensor& weight, const OptTensor& bias, double eps) {
  if (!records(input, weight, bias))
    return call_below_autograd(LayerNormFunction::op(), input, normalized_shape, weight, bias, eps);
  auto r = LayerNormFunction::apply(input, normalized_shape.vec(), weight, bias, eps);
  return {r[0], r[1], r[2]};
}

Tensor2 rms_norm_autograd(const at::Tensor& input, at::IntArrayRef normalized_shape,
                          const OptTensor& weight, double eps, double weight_offset) {
  if (!records(input, weight))
    return call_below_autograd(RmsNormFunction::op(), input, normalized_shape, weight, eps, weight_offset);
  auto r = RmsNormFunction::apply(input, normalized_shape.vec(), weight, eps, weight_offset);
  return {r[0], r[1]};
}

Tensor4 add_layer_norm_autograd(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight,
                                const OptTensor& bias, double eps) {
  if (!records(input, residual, weight, bias))
    return call_below_autograd(AddLayerNormFunction::op(), input, residual, weight, bias, eps);
  auto r = AddLayerNormFunction::apply(input, residual, weight, bias, eps);
  return {r[0], r[1], r[2], r[3]};
}

Tensor3 add_rms_norm_autograd(const at::Tensor& input, const at::Tensor& residual, const OptTensor& weight,
                              double eps) {
  if (!records(input, residual, weight))
    return call_below_autograd(AddRmsNormFunction::op(), input, residual, weight, eps);
  auto r = AddRmsNormFunction::apply(input, residual, weight, eps);
  return {r[0], r[1], r[2]};
}

void kernels(torch::Library& m) {
  m.impl("layer_norm", &layer_norm);
  m.impl("layer_norm_backward", &layer_norm_backward);
  m.impl("rms_norm", &rms_norm);
  m.impl("rms_norm_backward", &rms_norm_backward);
  m.impl("add_layer_norm", &add_layer_norm);
  m.impl("add_layer_norm_backward", &add_layer_norm_backward);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("add_rms_norm_backward", &add_rms_norm_backward);
}

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops;
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("add_layer_norm", &add_layer_norm_autograd);
  m.impl("add_rms_norm", &add_rms_norm_autograd);
}

namespace tessera::torch_ops::fast {
at::Tensor layer_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                      double eps) {
  return std::get<0>(layer_norm_with(input, normalized_shape, weight, bias, eps, false));
}

at::Tensor rms_norm(const at::Tensor& input, at::IntArrayRef normalized_shape,
                    const std::optional<at::Tensor>& weight, double eps, double weight_offset) {
  return std::get<0>(rms_norm_with(input, normalized_shape, weight, eps, weight_offset, false));
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& input, const at::Tensor& residual,
                                                  const std::optional<at::Tensor>& weight,
                                                  const std::optional<at::Tensor>& bias, double eps) {
  auto [out, res, mean, rstd] = add_layer_norm_with(input, residual, weight, bias, eps, false);
  return {out, res};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& input, const at::Tensor& residual,
                                                const std::optional<at::Tensor>& weight, double eps) {
  auto [out, res, rstd] = add_rms_norm_with(input, residual, weight, eps, false);
  return {out, res};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_backward(
    const at::Tensor& grad_output, const at::Tensor& input, at::IntArrayRef normalized_shape,
    const at::Tensor& mean, const at::Tensor& rstd, const std::optional<at::Tensor>& weight,
    std::array<bool, 3> output_mask) {
  return torch_ops::layer_norm_backward(grad_output, input, normalized_shape, mean, rstd, weight, output_mask);
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                     at::IntArrayRef normalized_shape, const at::Tensor& rstd,
                                                     const std::optional<at::Tensor>& weight,
                                                     std::array<bool, 2> output_mask, double weight_offset) {
  return torch_ops::rms_norm_backward(grad_output, input, normalized_shape, rstd, weight, output_mask,
                                      weight_offset);
}
}  // namespace tessera::torch_ops::fast
