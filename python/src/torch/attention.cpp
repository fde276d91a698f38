// Attention as torch ops: attention (out and lse, FlashAttention's [batch, seq, heads, head_dim]
// layout) and attention_backward, with the autograd kernel that ties them. Schemas: the
// descriptions' (src/ops/attention/attention_cases.cpp). lse is float32 [batch, heads_q, seq_q]
// and not differentiable.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <tuple>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

AttentionOptions options_of(bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                            double softcap) {
  AttentionOptions o;
  o.causal = causal, o.scale = scale ? *scale : 0.0, o.window_left = window_left, o.window_right = window_right;
  o.softcap = softcap;
  return o;
}

// torch's scale=0 is a scale of 0 (uniform weights); the library's 0 means the default. Refused
// here by name rather than silently taken as the default.
void check_scale(const char* op, std::optional<double> scale) {
  TORCH_CHECK_VALUE(!scale || *scale > 0, "tessera.", op, ": argument 'scale': expected a number > 0 or None, got ",
                    scale ? *scale : 0.0);
}

Tensor2 attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                  std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap) {
  const char* op = "attention";
  const TensorView tq = view(op, "q", q), tk = view(op, "k", k), tv = view(op, "v", v);
  check_scale(op, scale);
  const bool shaped = q.dim() == 4 && v.dim() == 4;
  at::Tensor out = shaped ? at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options()) : at::empty_like(q);
  at::Tensor lse = shaped ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                          : at::empty({0}, q.options().dtype(at::kFloat));
  guarded([&] {
    const TensorView tl = view(op, "lse", lse);
    tessera::attention(tq, tk, tv, view(op, "out", out), &tl,
                       options_of(causal, scale, window_left, window_right, softcap), stream_of(q));
  });
  return {out, lse};
}

Tensor3 attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
                           int64_t window_left, int64_t window_right, double softcap) {
  const char* op = "attention_backward";
  const TensorView tg = view(op, "grad_out", grad_out), tq = view(op, "q", q), tk = view(op, "k", k),
                   tv = view(op, "v", v), to = view(op, "out", out), tl = view(op, "lse", lse);
  check_scale(op, scale);
  at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous), dk = at::empty_like(k, at::MemoryFormat::Contiguous),
             dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::attention_backward(tg, tq, tk, tv, to, tl, view(op, "dq", dq), view(op, "dk", dk), view(op, "dv", dv),
                                options_of(causal, scale, window_left, window_right, softcap), stream_of(q));
  });
  return {dq, dk, dv};
}

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  static const auto& op() {
    static const auto h = handle<Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                         std::optional<double>, int64_t, int64_t, double)>("attention");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                               double softcap) {
    auto [out, lse] = call_below_autograd(op(), q, k, v, causal, scale, window_left, window_right, softcap);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale ? *scale : 0.0;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["softcap"] = softcap;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = handle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&, const at::Tensor&, bool, std::optional<double>, int64_t,
                                          int64_t, double)>("attention_backward");
    const auto s = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    const double scale = ctx->saved_data["scale"].toDouble();
    auto [dq, dk, dv] = op.call(grad, s[0], s[1], s[2], s[3], s[4], ctx->saved_data["causal"].toBool(),
                                scale > 0 ? std::optional<double>(scale) : std::nullopt,
                                ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(),
                                ctx->saved_data["softcap"].toDouble());
    return {dq, dk, dv, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

Tensor2 attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                           std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap) {
  if (!records(q, k, v))
    return call_below_autograd(AttentionFunction::op(), q, k, v, causal, scale, window_left, window_right, softcap);
  auto r = AttentionFunction::apply(q, k, v, causal, scale, window_left, window_right, softcap);
  return {r[0], r[1]};
}

void kernels(torch::Library& m) {
  m.impl("attention", &attention);
  m.impl("attention_backward", &attention_backward);
}

}  // namespace
}  // namespace tessera::torch_ops

TORCH_LIBRARY_IMPL(tessera, CUDA, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, CPU, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, Autograd, m) { m.impl("attention", &tessera::torch_ops::attention_autograd); }
