// cross_entropy as torch ops: the functional op (loss, lse and, on request, the gradient for a
// loss gradient of 1), its in-place overload (the gradient written over the logits), and the
// backward overload that scales a saved gradient in place by the loss's gradient. The autograd
// kernel ties them: the forward computes the gradient in the same pass, the backward only scales
// it (nothing at all where the loss gradient is 1, as in training).
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>
#include <tuple>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Reduction reduction_of(const char* op, c10::string_view r) {
  if (r == "mean") return Reduction::mean;
  if (r == "sum") return Reduction::sum;
  if (r == "none") return Reduction::none;
  TORCH_CHECK_VALUE(false, "tessera.", op, ": argument 'reduction': expected 'mean', 'sum' or 'none', got '",
                    std::string(r), "'");
}

CrossEntropyOptions options_of(const char* op, int64_t ignore_index, c10::string_view reduction,
                               double label_smoothing, double z_loss, double softcap) {
  CrossEntropyOptions o;
  o.ignore_index = ignore_index, o.reduction = reduction_of(op, reduction), o.label_smoothing = label_smoothing;
  o.z_loss = z_loss, o.softcap = softcap;
  return o;
}

// loss ([] or [N]) and lse ([N]) for logits [N, V] (shapes only where the library will refuse them).
Tensor2 outputs(const at::Tensor& logits, Reduction r) {
  const auto f = logits.options().dtype(at::kFloat);
  const int64_t n = logits.dim() == 2 ? logits.size(0) : 0;
  return {r == Reduction::none ? at::empty({n}, f) : at::empty({}, f), at::empty({n}, f)};
}

Tensor3 cross_entropy(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                      c10::string_view reduction, double label_smoothing, double z_loss, double softcap,
                      bool with_grad) {
  const char* op = "cross_entropy";
  const TensorView tx = view(op, "logits", logits), tt = view(op, "target", target);
  const CrossEntropyOptions o = options_of(op, ignore_index, reduction, label_smoothing, z_loss, softcap);
  auto [loss, lse] = outputs(logits, o.reduction);
  at::Tensor grad = with_grad ? at::empty(logits.sizes(), logits.options()) : at::empty({0}, logits.options());
  guarded([&] {
    const TensorView tl = view(op, "loss", loss), ts = view(op, "lse", lse);
    const TensorView tg = with_grad ? view(op, "grad", grad) : TensorView{};
    tessera::cross_entropy(tx, tt, tl, &ts, with_grad ? &tg : nullptr, o, stream_of(logits));
  });
  return {loss, lse, grad};
}

Tensor2 cross_entropy_inplace(at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                              c10::string_view reduction, double label_smoothing, double z_loss, double softcap) {
  const char* op = "cross_entropy";
  const TensorView tx = view(op, "logits", logits), tt = view(op, "target", target);
  const CrossEntropyOptions o = options_of(op, ignore_index, reduction, label_smoothing, z_loss, softcap);
  auto [loss, lse] = outputs(logits, o.reduction);
  guarded([&] {
    const TensorView tl = view(op, "loss", loss), ts = view(op, "lse", lse);
    tessera::cross_entropy(tx, tt, tl, &ts, &tx, o, stream_of(logits));
  });
  return {loss, lse};
}

void cross_entropy_backward(const at::Tensor& grad_loss, at::Tensor& grad, c10::string_view reduction) {
  const char* op = "cross_entropy_backward";
  const TensorView tf = view(op, "grad_loss", grad_loss), tg = view(op, "grad", grad);
  const Reduction r = reduction_of(op, reduction);
  guarded([&] { tessera::cross_entropy_backward(tf, tg, r, stream_of(grad)); });
}

// The saved gradient scaled by the loss's gradient and handed to autograd; it is consumed, so a
// second backward through the same loss (retain_graph) is refused rather than scaled twice.
at::Tensor scaled_saved_grad(AutogradContext* ctx, const variable_list& grads) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("tessera::cross_entropy", "backward")
                             .typed<void(const at::Tensor&, at::Tensor&, c10::string_view)>();
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

struct CrossEntropyFunction : torch::autograd::Function<CrossEntropyFunction> {
  static const auto& op() {
    static const auto h = handle<Tensor3(const at::Tensor&, const at::Tensor&, int64_t, c10::string_view, double, double,
                                         double, bool)>("cross_entropy");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                               int64_t ignore_index, c10::string_view reduction, double label_smoothing, double z_loss,
                               double softcap) {
    auto [loss, lse, grad] =
        call_below_autograd(op(), logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap, true);
    ctx->saved_data["grad"] = grad;
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->mark_non_differentiable({lse});
    return {loss, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(7);
    r[0] = scaled_saved_grad(ctx, grads);
    return r;
  }
};

// The in-place form: the logits' storage receives the gradient in the forward (Liger-style), so
// training holds no second N x V buffer; the logits' values are gone after the call.
struct CrossEntropyInplaceFunction : torch::autograd::Function<CrossEntropyInplaceFunction> {
  using Sig = Tensor2(at::Tensor&, const at::Tensor&, int64_t, c10::string_view, double, double, double);
  static const c10::TypedOperatorHandle<Sig>& op() {
    static const auto h =
        c10::Dispatcher::singleton().findSchemaOrThrow("tessera::cross_entropy", "inplace").typed<Sig>();
    return h;
  }
  static variable_list forward(AutogradContext* ctx, at::Tensor logits, const at::Tensor& target, int64_t ignore_index,
                               c10::string_view reduction, double label_smoothing, double z_loss, double softcap) {
    auto [loss, lse] =
        call_below_autograd(op(), logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap);
    ctx->saved_data["grad"] = logits;
    ctx->saved_data["reduction"] = std::string(reduction);
    ctx->mark_non_differentiable({lse});
    return {loss, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list r(7);
    r[0] = scaled_saved_grad(ctx, grads);
    return r;
  }
};

Tensor3 cross_entropy_autograd(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                               c10::string_view reduction, double label_smoothing, double z_loss, double softcap,
                               bool with_grad) {
  if (!records(logits))
    return call_below_autograd(CrossEntropyFunction::op(), logits, target, ignore_index, reduction, label_smoothing,
                               z_loss, softcap, with_grad);
  auto r = CrossEntropyFunction::apply(logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap);
  return {r[0], r[1], at::empty({0}, logits.options())};
}

Tensor2 cross_entropy_inplace_autograd(at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                       c10::string_view reduction, double label_smoothing, double z_loss,
                                       double softcap) {
  if (!records(logits))
    return call_below_autograd(CrossEntropyInplaceFunction::op(), logits, target, ignore_index, reduction,
                               label_smoothing, z_loss, softcap);
  auto r = CrossEntropyInplaceFunction::apply(logits, target, ignore_index, reduction, label_smoothing, z_loss,
                                              softcap);
  return {r[0], r[1]};
}

void kernels(torch::Library& m) {
  m.impl("cross_entropy", &cross_entropy);
  m.impl("cross_entropy.inplace", &cross_entropy_inplace);
  m.impl("cross_entropy.backward", &cross_entropy_backward);
}

}  // namespace
}  // namespace tessera::torch_ops

TORCH_LIBRARY_IMPL(tessera, CUDA, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, CPU, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  m.impl("cross_entropy", &tessera::torch_ops::cross_entropy_autograd);
  m.impl("cross_entropy.inplace", &tessera::torch_ops::cross_entropy_inplace_autograd);
}
