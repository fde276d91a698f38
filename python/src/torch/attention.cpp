// Attention as torch ops: attention (out and lse, FlashAttention's [batch, seq, heads, head_dim]
// layout) and attention_backward, with the autograd kernel that ties them. Schemas: the
// descriptions' (src/ops/attention/attention.cu). lse is float32 [batch, heads_q, seq_q]
// and not differentiable; so are ALiBi's slopes (alibi_slopes), as in FlashAttention: they get no
// gradient (None), even where they require one.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <optional>
#include <tuple>
#include <vector>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

using OptTensor = std::optional<at::Tensor>;

// alibi: the view of alibi_slopes (or null), which the options point to.
AttentionOptions options_of(bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                            double softcap, bool deterministic, const TensorView* alibi) {
  AttentionOptions o;
  o.causal = causal, o.scale = scale ? *scale : 0.0, o.window_left = window_left, o.window_right = window_right;
  o.softcap = softcap, o.deterministic = deterministic, o.alibi_slopes = alibi;
  return o;
}

// torch's scale=0 is a scale of 0 (uniform weights); the library's 0 means the default. Refused
// here by name rather than silently taken as the default.
void check_scale(const char* op, std::optional<double> scale) {
  TORCH_CHECK_VALUE(!scale || *scale > 0, "tessera.", op, ": argument 'scale': expected a number > 0 or None, got ",
                    scale ? *scale : 0.0);
}

Tensor2 attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                  std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap,
                  bool deterministic, const OptTensor& alibi_slopes) {
  const char* op = "attention";
  TensorView slot;
  const TensorView tq = view(op, "q", q), tk = view(op, "k", k), tv = view(op, "v", v);
  const TensorView* ta = optional_view(op, "alibi_slopes", alibi_slopes, slot);
  check_scale(op, scale);
  const bool shaped = q.dim() == 4 && v.dim() == 4;
  at::Tensor out = shaped ? at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options()) : at::empty_like(q);
  at::Tensor lse = shaped ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                          : at::empty({0}, q.options().dtype(at::kFloat));
  guarded([&] {
    const TensorView tl = view(op, "lse", lse);
    tessera::attention(tq, tk, tv, view(op, "out", out), &tl,
                       options_of(causal, scale, window_left, window_right, softcap, deterministic, ta), stream_of(q));
  });
  return {out, lse};
}

// The gradient as the tensor-core backward takes it: a broadcast one (of a sum: stride 0) or one
// with a strided last dimension would otherwise go to the generic tier (slow, and rounded
// differently), from autograd and from the routed SDPA alike; other layouts (a transposed view, as
// SDPA's) pass as they are.
at::Tensor dense(const at::Tensor& g) {
  bool ok = g.dim() == 0 || g.stride(-1) == 1;
  for (int64_t d = 0; ok && d < g.dim(); ++d) ok = g.stride(d) != 0 || g.size(d) <= 1;
  return ok ? g : g.contiguous();
}

Tensor3 attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& out, const at::Tensor& lse, bool causal, std::optional<double> scale,
                           int64_t window_left, int64_t window_right, double softcap, bool deterministic,
                           const OptTensor& alibi_slopes) {
  const char* op = "attention_backward";
  const at::Tensor g = dense(grad_out);
  TensorView slot;
  const TensorView tg = view(op, "grad_out", g), tq = view(op, "q", q), tk = view(op, "k", k),
                   tv = view(op, "v", v), to = view(op, "out", out), tl = view(op, "lse", lse);
  const TensorView* ta = optional_view(op, "alibi_slopes", alibi_slopes, slot);
  check_scale(op, scale);
  at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous), dk = at::empty_like(k, at::MemoryFormat::Contiguous),
             dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::attention_backward(tg, tq, tk, tv, to, tl, view(op, "dq", dq), view(op, "dk", dk), view(op, "dv", dv),
                                options_of(causal, scale, window_left, window_right, softcap, deterministic, ta),
                                stream_of(q));
  });
  return {dq, dk, dv};
}

Tensor2 attention_varlen(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
                         const at::Tensor& cu_k, int64_t max_q, int64_t max_k, bool causal, std::optional<double> scale,
                         int64_t window_left, int64_t window_right, double softcap, bool deterministic,
                         const OptTensor& alibi_slopes) {
  const char* op = "attention_varlen";
  TensorView slot;
  const TensorView tq = view(op, "q", q), tk = view(op, "k", k), tv = view(op, "v", v),
                   tcq = view(op, "cu_seqlens_q", cu_q), tck = view(op, "cu_seqlens_k", cu_k);
  const TensorView* ta = optional_view(op, "alibi_slopes", alibi_slopes, slot);
  check_scale(op, scale);
  const bool shaped = q.dim() == 3 && v.dim() == 3;
  at::Tensor out = shaped ? at::empty({q.size(0), q.size(1), v.size(2)}, q.options()) : at::empty_like(q);
  at::Tensor lse = at::empty(shaped ? std::vector<int64_t>{q.size(1), q.size(0)} : std::vector<int64_t>{0},
                             q.options().dtype(at::kFloat));
  guarded([&] {
    const TensorView tl = view(op, "lse", lse);
    tessera::attention_varlen(tq, tk, tv, view(op, "out", out), &tl, tcq, tck, max_q, max_k,
                              options_of(causal, scale, window_left, window_right, softcap, deterministic, ta),
                              stream_of(q));
  });
  return {out, lse};
}

// Inference only: no autograd kernel, so torch refuses a backward through it by name.
Tensor2 attention_kvcache(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& cache_seqlens, const OptTensor& block_table, bool causal,
                          std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap,
                          const OptTensor& alibi_slopes) {
  const char* op = "attention_kvcache";
  TensorView slot, alibi_slot;
  const TensorView tq = view(op, "q", q), tk = view(op, "k_cache", k_cache), tv = view(op, "v_cache", v_cache),
                   tn = view(op, "cache_seqlens", cache_seqlens);
  const TensorView* tt = optional_view(op, "block_table", block_table, slot);
  const TensorView* ta = optional_view(op, "alibi_slopes", alibi_slopes, alibi_slot);
  check_scale(op, scale);
  const bool shaped = q.dim() == 4 && v_cache.dim() == 4;
  at::Tensor out = shaped ? at::empty({q.size(0), q.size(1), q.size(2), v_cache.size(3)}, q.options()) : at::empty_like(q);
  at::Tensor lse = shaped ? at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat))
                          : at::empty({0}, q.options().dtype(at::kFloat));
  guarded([&] {
    const TensorView tl = view(op, "lse", lse);
    tessera::attention_kvcache(tq, tk, tv, view(op, "out", out), &tl, tn, tt,
                               options_of(causal, scale, window_left, window_right, softcap, false, ta), stream_of(q));
  });
  return {out, lse};
}

Tensor3 attention_varlen_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                                  bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                                  double softcap, bool deterministic, const OptTensor& alibi_slopes) {
  const char* op = "attention_varlen_backward";
  const at::Tensor g = dense(grad_out);
  TensorView slot;
  const TensorView tg = view(op, "grad_out", g), tq = view(op, "q", q), tk = view(op, "k", k),
                   tv = view(op, "v", v), to = view(op, "out", out), tl = view(op, "lse", lse),
                   tcq = view(op, "cu_seqlens_q", cu_q), tck = view(op, "cu_seqlens_k", cu_k);
  const TensorView* ta = optional_view(op, "alibi_slopes", alibi_slopes, slot);
  check_scale(op, scale);
  at::Tensor dq = at::empty_like(q, at::MemoryFormat::Contiguous), dk = at::empty_like(k, at::MemoryFormat::Contiguous),
             dv = at::empty_like(v, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::attention_varlen_backward(tg, tq, tk, tv, to, tl, view(op, "dq", dq), view(op, "dk", dk),
                                       view(op, "dv", dv), tcq, tck, max_q, max_k,
                                       options_of(causal, scale, window_left, window_right, softcap, deterministic, ta),
                                       stream_of(q));
  });
  return {dq, dk, dv};
}

// The options an autograd node keeps for its backward (alibi_slopes among its saved tensors).
void save_options(AutogradContext* ctx, bool causal, std::optional<double> scale, int64_t window_left,
                  int64_t window_right, double softcap, bool deterministic) {
  ctx->saved_data["deterministic"] = deterministic;
  ctx->saved_data["causal"] = causal;
  ctx->saved_data["scale"] = scale ? *scale : 0.0;
  ctx->saved_data["window_left"] = window_left;
  ctx->saved_data["window_right"] = window_right;
  ctx->saved_data["softcap"] = softcap;
}
std::optional<double> saved_scale(AutogradContext* ctx) {
  const double scale = ctx->saved_data["scale"].toDouble();
  return scale > 0 ? std::optional<double>(scale) : std::nullopt;
}
OptTensor saved_optional(const at::Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

struct AttentionFunction : torch::autograd::Function<AttentionFunction> {
  using Sig = Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, std::optional<double>, int64_t,
                      int64_t, double, bool, const OptTensor&);
  static const c10::TypedOperatorHandle<Sig>& op() {
    static const auto h = handle<Sig>("attention");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                               double softcap, bool deterministic, const OptTensor& alibi_slopes) {
    auto [out, lse] = call_below_autograd(op(), q, k, v, causal, scale, window_left, window_right, softcap,
                                          deterministic, alibi_slopes);
    ctx->save_for_backward({q, k, v, out, lse, alibi_slopes.value_or(at::Tensor())});
    save_options(ctx, causal, scale, window_left, window_right, softcap, deterministic);
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = handle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                          const at::Tensor&, const at::Tensor&, bool, std::optional<double>, int64_t,
                                          int64_t, double, bool, const OptTensor&)>("attention_backward");
    const auto s = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    auto [dq, dk, dv] = op.call(grad, s[0], s[1], s[2], s[3], s[4], ctx->saved_data["causal"].toBool(), saved_scale(ctx),
                                ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(),
                                ctx->saved_data["softcap"].toDouble(), ctx->saved_data["deterministic"].toBool(),
                                saved_optional(s[5]));
    variable_list r(10);  // no gradient for the options, alibi_slopes included
    r[0] = dq, r[1] = dk, r[2] = dv;
    return r;
  }
};

struct VarlenFunction : torch::autograd::Function<VarlenFunction> {
  using Sig = Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      int64_t, int64_t, bool, std::optional<double>, int64_t, int64_t, double, bool, const OptTensor&);
  static const c10::TypedOperatorHandle<Sig>& op() {
    static const auto h = handle<Sig>("attention", "varlen");
    return h;
  }
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                               bool causal, std::optional<double> scale, int64_t window_left, int64_t window_right,
                               double softcap, bool deterministic, const OptTensor& alibi_slopes) {
    auto [out, lse] = call_below_autograd(op(), q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left,
                                          window_right, softcap, deterministic, alibi_slopes);
    ctx->save_for_backward({q, k, v, out, lse, cu_q, cu_k, alibi_slopes.value_or(at::Tensor())});
    save_options(ctx, causal, scale, window_left, window_right, softcap, deterministic);
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_k"] = max_k;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    using BSig = Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool,
                         std::optional<double>, int64_t, int64_t, double, bool, const OptTensor&);
    static const auto op = handle<BSig>("attention_backward", "varlen");
    const auto s = ctx->get_saved_variables();
    const at::Tensor grad = grads[0].defined() ? grads[0] : at::zeros_like(s[3]);
    auto [dq, dk, dv] = op.call(grad, s[0], s[1], s[2], s[3], s[4], s[5], s[6], ctx->saved_data["max_q"].toInt(),
                                ctx->saved_data["max_k"].toInt(), ctx->saved_data["causal"].toBool(), saved_scale(ctx),
                                ctx->saved_data["window_left"].toInt(), ctx->saved_data["window_right"].toInt(),
                                ctx->saved_data["softcap"].toDouble(), ctx->saved_data["deterministic"].toBool(),
                                saved_optional(s[7]));
    variable_list r(14);
    r[0] = dq, r[1] = dk, r[2] = dv;
    return r;
  }
};

Tensor2 attention_varlen_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_q, const at::Tensor& cu_k, int64_t max_q, int64_t max_k,
                                  bool causal, std::optional<double> scale, int64_t window_left,
                                  int64_t window_right, double softcap, bool deterministic,
                                  const OptTensor& alibi_slopes) {
  if (!records(q, k, v))
    return call_below_autograd(VarlenFunction::op(), q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left,
                               window_right, softcap, deterministic, alibi_slopes);
  auto r = VarlenFunction::apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, window_left, window_right, softcap,
                                 deterministic, alibi_slopes);
  return {r[0], r[1]};
}

Tensor2 attention_autograd(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                           std::optional<double> scale, int64_t window_left, int64_t window_right, double softcap,
                           bool deterministic, const OptTensor& alibi_slopes) {
  if (!records(q, k, v))
    return call_below_autograd(AttentionFunction::op(), q, k, v, causal, scale, window_left, window_right, softcap,
                               deterministic, alibi_slopes);
  auto r = AttentionFunction::apply(q, k, v, causal, scale, window_left, window_right, softcap, deterministic,
                                    alibi_slopes);
  return {r[0], r[1]};
}

void kernels(torch::Library& m) {
  m.impl("attention", &attention);
  m.impl("attention_backward", &attention_backward);
  m.impl("attention.varlen", &attention_varlen);
  m.impl("attention.kvcache", &attention_kvcache);
  m.impl("attention_backward.varlen", &attention_varlen_backward);
}

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)
TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  m.impl("attention", &tessera::torch_ops::attention_autograd);
  m.impl("attention.varlen", &tessera::torch_ops::attention_varlen_autograd);
}
