// The losses' autograd, written by hand; their kernels are the generic ones (the descriptions in
// src/ops/loss/). cross_entropy has three: the functional op (loss, lse and, on request, the
// gradient for a loss gradient of 1), its in-place overload (the gradient written over the
// logits), and the backward overload that scales a saved gradient in place by the loss's
// gradient. The autograd kernel ties them: the forward computes the gradient in the same pass, the
// backward only scales it (nothing at all where the loss gradient is 1, as in training).
// Probability targets and class weights that require grad get theirs from torch's ops in the
// backward (a rarer need; class weights only with probability targets, as torch's nll_loss
// refuses them for class indices). linear_cross_entropy likewise: its forward computes the
// gradients for a loss gradient of 1 and the backward scales them; with reduction 'none' the
// backward runs the chunks again with the per-row loss gradients.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
// linear_cross_entropy's: loss, lse, d_hidden, d_weight, d_bias, accuracy, predicted
using Tensor7 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using OptTensor = std::optional<at::Tensor>;

// The saved gradient scaled by the loss's gradient and handed to autograd; it is consumed, so a
// second backward through the same loss (retain_graph) is refused rather than scaled twice.
at::Tensor scaled_saved_grad(AutogradContext* ctx, const variable_list& grads) {
  static const auto op =
      handle<void(const at::Tensor&, at::Tensor&, c10::string_view)>("cross_entropy", "backward");
  TORCH_CHECK(ctx->saved_data.count("grad"),
              "tessera.cross_entropy: a second backward through the same loss (retain_graph) is not supported: the "
              "forward's gradient buffer is scaled in place by the first");
  at::Tensor grad = ctx->saved_data["grad"].toTensor();
  ctx->saved_data.erase("grad");
  const std::string reduction = ctx->saved_data["reduction"].toStringRef();
  at::Tensor g = grads[0].defined() ? grads[0].to(at::kFloat) : at::zeros({}, grad.options().dtype(at::kFloat));
  if (reduction == "none" && !grads[0].defined()) g = at::zeros({grad.size(0)}, grad.options().dtype(at::kFloat));
  op.call(g, grad, reduction);
  return grad;
}

// The gradients of probability targets q and class weights w: with c_ij = lse_i + z lse_i^2 -
// y_ij (y the capped logits) times the row's loss gradient s_i (over N for a mean),
//   d q_ij = (1 - e) w_j c_ij,   d w_j = sum_i q'_ij c_ij,   q' = (1 - e) q + e / V;
// from torch's ops (the logits read once more, only where one of them requires grad). Each
// undefined where not wanted.
std::array<at::Tensor, 2> probability_grads(const at::Tensor& logits, const at::Tensor& q, const at::Tensor& w,
                                            const at::Tensor& grad_loss, const std::string& reduction,
                                            const std::vector<double>& opt, bool want_q, bool want_w) {
  const double e = opt[0], z = opt[1], cap = opt[2];
  at::Tensor y = logits.to(at::kFloat);
  if (cap > 0) y = y.div(cap).tanh().mul(cap);
  const at::Tensor lse = y.logsumexp({1}, true);
  at::Tensor s = grad_loss.defined() ? grad_loss.to(at::kFloat) : at::zeros({}, y.options());
  if (reduction == "mean") s = s.div(double(std::max<int64_t>(logits.size(0), 1)));
  if (s.dim() == 1) s = s.unsqueeze(1);
  const at::Tensor c = lse.mul(lse).mul(z).add(lse).sub(y).mul(s);
  at::Tensor dq, dw;
  if (want_q) {
    dq = c.mul(1.0 - e);
    if (w.defined()) dq = dq.mul(w.to(at::kFloat));
    dq = dq.to(q.scalar_type());
  }
  if (want_w) dw = q.to(at::kFloat).mul(1.0 - e).add(e / double(logits.size(1))).mul(c).sum(0).to(w.scalar_type());
  return {dq, dw};
}

// The functional form keeps the gradient its forward wrote beside the logits; the in-place form
// (Liger-style) writes it over the logits' storage, so training holds no second N x V buffer (the
// logits' values are gone after the call, so probability targets and weights get no gradient).
template <bool Inplace>
struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction<Inplace>> {
  using Sig = std::conditional_t<
      Inplace,
      Tensor2(at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, c10::string_view, double, double, double),
      Tensor3(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t, c10::string_view, double, double, double,
              bool)>;
  static const c10::TypedOperatorHandle<Sig>& op() {
    static const auto h = handle<Sig>("cross_entropy", Inplace ? "inplace" : "");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, at::Tensor logits, const at::Tensor& target,
                               const OptTensor& weight, int64_t ignore_index, c10::string_view reduction,
                               double label_smoothing, double z_loss, double softcap) {
    const bool want_q = target.requires_grad(), want_w = requires_grad(weight);
    if (want_q || want_w) {
      TORCH_CHECK_VALUE(target.dim() == 2 && target.is_floating_point(),
                        "tessera.cross_entropy: argument 'weight': no gradient for class weights with class-index "
                        "targets (as torch's nll_loss); pass weight.detach()");
      TORCH_CHECK_VALUE(!Inplace,
                        "tessera.cross_entropy: inplace_grad=True overwrites the logits, which the gradients of the "
                        "probability targets and class weights need; call it without inplace_grad");
      ctx->save_for_backward({logits, target, weight ? *weight : at::Tensor()});
      ctx->saved_data["options"] = std::vector<double>{label_smoothing, z_loss, softcap};
    }
    at::Tensor loss, lse, grad = logits;
    if constexpr (Inplace)
      std::tie(loss, lse) = call_below_autograd(op(), logits, target, weight, ignore_index, reduction, label_smoothing,
                                                z_loss, softcap);
    else
      std::tie(loss, lse, grad) = call_below_autograd(op(), logits, target, weight, ignore_index, reduction,
                                                      label_smoothing, z_loss, softcap, logits.requires_grad());
    if (logits.requires_grad()) ctx->saved_data["grad"] = grad;
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->mark_non_differentiable({lse});
    return {loss, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(8);
    if (ctx->saved_data.count("options")) {
      const auto saved = ctx->get_saved_variables();
      auto [dq, dw] = probability_grads(saved[0], saved[1], saved[2], grads[0],
                                        ctx->saved_data["reduction"].toStringRef(),
                                        ctx->saved_data["options"].toDoubleVector(), ctx->needs_input_grad(1),
                                        saved[2].defined() && ctx->needs_input_grad(2));  // None: no edge 2
      r[1] = dq, r[2] = dw;
    }
    if (ctx->needs_input_grad(0)) r[0] = scaled_saved_grad(ctx, grads);
    return r;
  }
};

Tensor3 cross_entropy_autograd(const at::Tensor& logits, const at::Tensor& target, const OptTensor& weight,
                               int64_t ignore_index, c10::string_view reduction, double label_smoothing, double z_loss,
                               double softcap, bool with_grad) {
  if (!records(logits, target, weight))
    return call_below_autograd(CrossEntropyFunction<false>::op(), logits, target, weight, ignore_index, reduction,
                               label_smoothing, z_loss, softcap, with_grad);
  auto r = CrossEntropyFunction<false>::apply(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                                              softcap);
  // The gradient goes to autograd, not out of the op: an empty placeholder (an undefined output
  // of an autograd kernel breaks what wraps it, DTensor's dispatch).
  return {r[0], r[1], at::empty({0}, logits.options())};
}

Tensor2 cross_entropy_inplace_autograd(at::Tensor& logits, const at::Tensor& target, const OptTensor& weight,
                                       int64_t ignore_index, c10::string_view reduction, double label_smoothing,
                                       double z_loss, double softcap) {
  if (!records(logits, target, weight))
    return call_below_autograd(CrossEntropyFunction<true>::op(), logits, target, weight, ignore_index, reduction,
                               label_smoothing, z_loss, softcap);
  auto r = CrossEntropyFunction<true>::apply(logits, target, weight, ignore_index, reduction, label_smoothing, z_loss,
                                             softcap);
  return {r[0], r[1]};
}

using LceSig = Tensor7(const at::Tensor&, const at::Tensor&, const OptTensor&, const at::Tensor&, int64_t,
                       c10::string_view, double, double, double, int64_t, std::array<bool, 3>,
                       const OptTensor&, const OptTensor&, std::optional<at::ScalarType>, bool, bool);

// Mean and sum: the forward's gradients (for a loss gradient of 1), scaled in place by the loss's
// gradient, once (a second backward is refused, as cross_entropy's). None: the chunks again.
struct LinearCrossEntropyFunction : torch::autograd::Function<LinearCrossEntropyFunction> {
  static const auto& op() {
    static const auto h = handle<LceSig>("linear_cross_entropy");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const OptTensor& bias, const at::Tensor& target, int64_t ignore_index,
                               c10::string_view reduction, double label_smoothing, double z_loss, double softcap,
                               int64_t chunk_rows, const OptTensor& ce_weight,
                               std::optional<at::ScalarType> accum_dtype, bool token_accuracy,
                               bool predicted_tokens) {
    // Only the gradients autograd will ask for (a frozen output projection takes no d_weight).
    const bool none = reduction == "none";
    const std::array<bool, 3> mask = {!none && hidden.requires_grad(), !none && weight.requires_grad(),
                                      !none && bias && bias->requires_grad()};
    auto [loss, lse, dh, dw, db, acc, pred] =
        call_below_autograd(op(), hidden, weight, bias, target, ignore_index, reduction, label_smoothing, z_loss,
                            softcap, chunk_rows, mask, OptTensor(), ce_weight, accum_dtype, token_accuracy,
                            predicted_tokens);
    if (none) {
      ctx->save_for_backward({hidden, weight, bias ? *bias : at::Tensor(), target,
                              ce_weight ? *ce_weight : at::Tensor()});
    } else {
      ctx->saved_data["dh"] = dh, ctx->saved_data["dw"] = dw, ctx->saved_data["db"] = db;
      ctx->saved_data["mask"] = std::vector<bool>(mask.begin(), mask.end());
      ctx->saved_data["wtype"] = int64_t(weight.scalar_type());
    }
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->saved_data["options"] = std::vector<double>{double(ignore_index), label_smoothing, z_loss, softcap,
                                                     double(chunk_rows)};
    ctx->saved_data["bias"] = bias && bias->defined();
    if (accum_dtype) ctx->saved_data["accum_dtype"] = int64_t(*accum_dtype);
    // Without token_accuracy (predicted_tokens) the kernel gives None: an empty placeholder for
    // autograd's outputs.
    if (!acc.defined()) acc = at::empty({0}, hidden.options());
    if (!pred.defined()) pred = at::empty({0}, target.options());
    ctx->mark_non_differentiable({lse, acc, pred});
    return {loss, lse, acc, pred};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const std::string reduction = ctx->saved_data["reduction"].toStringRef();
    const bool has_bias = ctx->saved_data["bias"].toBool();
    variable_list r(14);
    const std::optional<at::ScalarType> accum =
        ctx->saved_data.count("accum_dtype") ? std::optional(at::ScalarType(ctx->saved_data["accum_dtype"].toInt()))
                                             : std::nullopt;
    const auto f = at::TensorOptions().dtype(at::kFloat);
    if (reduction == "none") {
      const auto saved = ctx->get_saved_variables();
      const auto opt = ctx->saved_data["options"].toDoubleVector();
      const at::Tensor g = grads[0].defined() ? grads[0].to(at::kFloat).contiguous()
                                              : at::zeros_like(saved[3], saved[3].options().dtype(at::kFloat));
      const std::array<bool, 3> mask = {ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                        has_bias && ctx->needs_input_grad(2)};
      auto [loss, lse, dh, dw, db, acc, pred] =
          call_below_autograd(op(), saved[0], saved[1], has_bias ? OptTensor(saved[2]) : OptTensor(), saved[3],
                              int64_t(opt[0]), "none", opt[1], opt[2], opt[3], int64_t(opt[4]), mask, OptTensor(g),
                              saved[4].defined() ? OptTensor(saved[4]) : OptTensor(), accum, false, false);
      r[0] = mask[0] ? dh : at::Tensor(), r[1] = mask[1] ? dw.to(saved[1].scalar_type()) : at::Tensor();
      r[2] = mask[2] ? db : at::Tensor();
      return r;
    }
    TORCH_CHECK(ctx->saved_data.count("dh"),
                "tessera.linear_cross_entropy: a second backward through the same loss (retain_graph) is not "
                "supported: the forward's gradients are scaled in place by the first");
    at::Tensor dh = ctx->saved_data["dh"].toTensor(), dw = ctx->saved_data["dw"].toTensor(),
               db = ctx->saved_data["db"].toTensor();
    for (const char* k : {"dh", "dw", "db"}) ctx->saved_data.erase(k);
    static const auto scale =
        handle<void(const at::Tensor&, at::Tensor&, c10::string_view)>("cross_entropy", "backward");
    const at::Tensor g = grads[0].defined() ? grads[0].to(at::kFloat) : at::zeros({}, f.device(dh.device()));
    const auto mask = ctx->saved_data["mask"].toBoolList();
    at::Tensor* out[3] = {&dh, &dw, &db};
    for (int i = 0; i < 3; ++i) {
      if (!mask[i]) {  // not computed: an empty placeholder
        *out[i] = at::Tensor();
        continue;
      }
      at::Tensor rows = out[i]->dim() == 2 ? *out[i] : out[i]->unsqueeze(0);
      scale.call(g, rows, "mean");
    }
    // d_weight accumulated in accum_dtype goes to autograd in the weight's dtype
    const auto wtype = ctx->saved_data.count("wtype") ? at::ScalarType(ctx->saved_data["wtype"].toInt()) : at::kFloat;
    r[0] = dh, r[1] = dw.defined() && accum ? dw.to(wtype) : dw, r[2] = db;
    return r;
  }
};

Tensor7 linear_cross_entropy_autograd(const at::Tensor& hidden, const at::Tensor& weight, const OptTensor& bias,
                                      const at::Tensor& target, int64_t ignore_index, c10::string_view reduction,
                                      double label_smoothing, double z_loss, double softcap, int64_t chunk_rows,
                                      std::array<bool, 3> output_mask, const OptTensor& grad_loss,
                                      const OptTensor& ce_weight, std::optional<at::ScalarType> accum_dtype,
                                      bool token_accuracy, bool predicted_tokens) {
  if (!records(hidden, weight, bias))
    return call_below_autograd(LinearCrossEntropyFunction::op(), hidden, weight, bias, target, ignore_index,
                               reduction, label_smoothing, z_loss, softcap, chunk_rows, output_mask, grad_loss,
                               ce_weight, accum_dtype, token_accuracy, predicted_tokens);
  auto r = LinearCrossEntropyFunction::apply(hidden, weight, bias, target, ignore_index, reduction, label_smoothing,
                                             z_loss, softcap, chunk_rows, ce_weight, accum_dtype, token_accuracy,
                                             predicted_tokens);
  // The gradients go to autograd, not out of the op: three placeholders, none aliasing another (as
  // cross_entropy's).
  return {r[0], r[1], at::empty({0}, hidden.options()), at::empty({0}, weight.options()),
          at::empty({0}, weight.options()), r[2], r[3]};
}

}  // namespace
}  // namespace tessera::torch_ops

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  m.impl("cross_entropy", &tessera::torch_ops::cross_entropy_autograd);
  m.impl("cross_entropy.inplace", &tessera::torch_ops::cross_entropy_inplace_autograd);
  m.impl("linear_cross_entropy", &tessera::torch_ops::linear_cross_entropy_autograd);
}
