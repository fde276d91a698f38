// tessera.enable(): torch's own functions routed to tessera's kernels for the CUDA dispatch key.
//
// enable() registers, for each chosen aten op, a CUDA kernel that runs tessera's op where it takes
// the arguments (CUDA tensors of one float dtype tessera supports, the forms below) and otherwise
// torch's own CUDA kernel, called directly through at::cuda:: (no dispatch, so no recursion into
// this override). The registrations live in one torch::Library object: disable() destroys it and
// torch's kernels are back. Autograd is untouched: aten's derivative formulas run above and call
// the routed backward ops (softmax's _softmax_backward_data, ...), which route in turn.
#include "binding.hpp"  // first: torch's per-backend headers below assume ATen's core ones

#include <ATen/ops/_fused_rms_norm_backward_cuda_dispatch.h>
#include <ATen/ops/_fused_rms_norm_cuda_dispatch.h>
#include <ATen/ops/_log_softmax_backward_data_cuda_dispatch.h>
#include <ATen/ops/_log_softmax_cuda_dispatch.h>
#include <ATen/ops/_softmax_backward_data_cuda_dispatch.h>
#include <ATen/ops/_softmax_cuda_dispatch.h>
#include <ATen/ops/add_cuda_dispatch.h>
#include <ATen/ops/addmm_cuda_dispatch.h>
#include <ATen/ops/bmm_cuda_dispatch.h>
#include <ATen/ops/gelu_backward_cuda_dispatch.h>
#include <ATen/ops/gelu_cuda_dispatch.h>
#include <ATen/ops/isin_cuda_dispatch.h>
#include <ATen/ops/mm_cuda_dispatch.h>
#include <ATen/ops/native_layer_norm_backward_cuda_dispatch.h>
#include <ATen/ops/native_layer_norm_cuda_dispatch.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_cuda_dispatch.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_cuda_dispatch.h>
#include <ATen/ops/cross_entropy_loss_native.h>
#include <ATen/ops/silu_backward_cuda_dispatch.h>
#include <ATen/ops/silu_cuda_dispatch.h>

#include <ATen/Context.h>
#include <ATen/ops/zeros.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::torch_ops {
namespace {

using OptTensor = std::optional<at::Tensor>;
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;

// The routable ops, in the order of the counters (and of tessera._routing's names).
constexpr const char* kRouted[] = {
    "add.Tensor", "gelu", "gelu_backward", "silu", "silu_backward", "_softmax", "_log_softmax",
    "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
    "native_layer_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward", "isin.Tensor_Tensor",
    "mm", "addmm", "bmm", "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "cross_entropy_loss"};
constexpr int kCount = static_cast<int>(std::size(kRouted));
enum Route { kAdd, kGelu, kGeluBackward, kSilu, kSiluBackward, kSoftmax, kLogSoftmax,
             kSoftmaxBackward, kLogSoftmaxBackward, kLayerNorm, kLayerNormBackward, kRmsNorm,
             kRmsNormBackward, kIsin, kMm, kAddmm, kBmm, kSdpa, kSdpaBackward, kCrossEntropy };
// Routes registered for the AutogradCUDA key, not CUDA: aten ops that torch decomposes before any
// backend kernel (CompositeImplicitAutograd), whose kernel here brings its own autograd.
constexpr bool at_autograd(int r) { return r == kCrossEntropy; }

std::array<std::atomic<int64_t>, 2 * kCount> counts{};  // [2 r]: tessera, [2 r + 1]: torch
std::atomic<bool> counting{false};
std::mutex mu;
std::unique_ptr<torch::Library> routes;           // the live registrations (null: none)
std::unique_ptr<torch::Library> autograd_routes;  // those of the AutogradCUDA key

// Counts a call of route `r` (where enable(log=True) asked for it) and says whether it is tessera's.
bool ran(Route r, bool tessera) {
  if (counting.load(std::memory_order_relaxed))
    counts[2 * r + (tessera ? 0 : 1)].fetch_add(1, std::memory_order_relaxed);
  return tessera;
}

bool float_dtype(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

// CUDA tensors of one float dtype tessera takes, on one device (an absent optional passes).
bool takes(const at::Tensor& first) { return first.is_cuda() && float_dtype(first); }
bool takes(const at::Tensor& first, const at::Tensor& t) {
  return t.is_cuda() && t.scalar_type() == first.scalar_type() && t.device() == first.device();
}
bool takes(const at::Tensor& first, const OptTensor& t) { return !t || !t->defined() || takes(first, *t); }
template <class... T>
bool all_take(const at::Tensor& first, const T&... rest) {
  return takes(first) && (takes(first, rest) && ...);
}
// The elementwise routes also ask for contiguous tensors: torch's kernels run permuted dense
// layouts as flat arrays, where tessera's strided path indexes every element.
template <class... T>
bool all_dense(const T&... t) {
  return (t.is_contiguous() && ...);
}

// ---- the routed kernels ---------------------------------------------------------------------------

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("add");
  if (ran(kAdd, all_take(self, other) && all_dense(self, other) && !alpha.isComplex()))
    return op.call(self, other, alpha.toDouble());
  return at::cuda::add(self, other, alpha);
}

at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  static const auto op = handle<at::Tensor(const at::Tensor&, c10::string_view)>("gelu");
  if (ran(kGelu, all_take(self) && all_dense(self))) return op.call(self, approximate);
  return at::cuda::gelu(self, approximate);
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& self, c10::string_view approximate) {
  static const auto op =
      handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>("gelu_backward");
  if (ran(kGeluBackward, all_take(self, grad) && all_dense(self, grad) && grad.sizes() == self.sizes()))
    return op.call(grad, self, approximate);
  return at::cuda::gelu_backward(grad, self, approximate);
}

at::Tensor silu(const at::Tensor& self) {
  static const auto op = handle<at::Tensor(const at::Tensor&)>("silu");
  if (ran(kSilu, all_take(self) && all_dense(self))) return op.call(self);
  return at::cuda::silu(self);
}

at::Tensor silu_backward(const at::Tensor& grad, const at::Tensor& self) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("silu_backward");
  if (ran(kSiluBackward, all_take(self, grad) && all_dense(self, grad) && grad.sizes() == self.sizes()))
    return op.call(grad, self);
  return at::cuda::silu_backward(grad, self);
}

// half_to_float (a float32 result of a half input) is torch's alone.
template <bool Log>
at::Tensor softmax(const at::Tensor& self, int64_t dim, bool half_to_float) {
  static const auto op = handle<at::Tensor(const at::Tensor&, int64_t)>(Log ? "log_softmax" : "softmax");
  if (ran(Log ? kLogSoftmax : kSoftmax, all_take(self) && !half_to_float)) return op.call(self, dim);
  return Log ? at::cuda::_log_softmax(self, dim, half_to_float) : at::cuda::_softmax(self, dim, half_to_float);
}

template <bool Log>
at::Tensor softmax_backward(const at::Tensor& grad, const at::Tensor& output, int64_t dim,
                            at::ScalarType input_dtype) {
  static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t)>(
      Log ? "log_softmax_backward" : "softmax_backward");
  if (ran(Log ? kLogSoftmaxBackward : kSoftmaxBackward,
          all_take(output, grad) && input_dtype == output.scalar_type()))
    return op.call(grad, output, dim);
  return Log ? at::cuda::_log_softmax_backward_data(grad, output, dim, input_dtype)
             : at::cuda::_softmax_backward_data(grad, output, dim, input_dtype);
}

// torch's statistics have the normalized dimensions kept (size 1); tessera's the leading shape.
std::vector<int64_t> kept_shape(const at::Tensor& x, int64_t k) {
  std::vector<int64_t> s(x.sizes().begin(), x.sizes().end() - k);
  s.insert(s.end(), k, 1);
  return s;
}

Tensor3 native_layer_norm(const at::Tensor& input, at::IntArrayRef shape, const OptTensor& weight,
                          const OptTensor& bias, double eps) {
  static const auto op = handle<Tensor3(const at::Tensor&, at::IntArrayRef, const OptTensor&,
                                        const OptTensor&, double)>("layer_norm");
  if (ran(kLayerNorm, all_take(input, weight, bias) && input.numel() > 0)) {
    auto [out, mean, rstd] = op.call(input, shape, weight, bias, eps);
    const auto kept = kept_shape(input, static_cast<int64_t>(shape.size()));
    return {out, mean.view(kept), rstd.view(kept)};
  }
  return at::cuda::native_layer_norm(input, shape, weight, bias, eps);
}

Tensor3 native_layer_norm_backward(const at::Tensor& grad, const at::Tensor& input,
                                   at::IntArrayRef shape, const at::Tensor& mean,
                                   const at::Tensor& rstd, const OptTensor& weight,
                                   const OptTensor& bias, std::array<bool, 3> mask) {
  static const auto op =
      handle<Tensor3(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                     const at::Tensor&, const OptTensor&, const OptTensor&, std::array<bool, 3>)>(
          "layer_norm_backward");
  const int64_t k = static_cast<int64_t>(shape.size());
  const bool f32_stats = mean.scalar_type() == at::kFloat && rstd.scalar_type() == at::kFloat;
  if (ran(kLayerNormBackward, all_take(input, grad, weight, bias) && f32_stats && input.numel() > 0)) {
    const at::IntArrayRef lead = input.sizes().slice(0, input.dim() - k);
    return op.call(grad, input, shape, mean.reshape(lead), rstd.reshape(lead), weight, bias, mask);
  }
  return at::cuda::native_layer_norm_backward(grad, input, shape, mean, rstd, weight, bias, mask);
}

// torch's default eps: float32's epsilon for every dtype tessera takes (its accumulation type).
Tensor2 fused_rms_norm(const at::Tensor& input, at::IntArrayRef shape, const OptTensor& weight,
                       std::optional<double> eps) {
  static const auto op =
      handle<Tensor2(const at::Tensor&, at::IntArrayRef, const OptTensor&, double, double)>("rms_norm");
  if (ran(kRmsNorm, all_take(input, weight) && input.numel() > 0)) {
    auto [out, rstd] = op.call(input, shape, weight, eps.value_or(1.1920928955078125e-07), 0.0);
    return {out, rstd.view(kept_shape(input, static_cast<int64_t>(shape.size())))};
  }
  return at::cuda::_fused_rms_norm(input, shape, weight, eps);
}

Tensor2 fused_rms_norm_backward(const at::Tensor& grad, const at::Tensor& input, at::IntArrayRef shape,
                                const at::Tensor& rstd, const OptTensor& weight, std::array<bool, 2> mask) {
  static const auto op =
      handle<Tensor2(const at::Tensor&, const at::Tensor&, at::IntArrayRef, const at::Tensor&,
                     const OptTensor&, std::array<bool, 2>, double)>("rms_norm_backward");
  const int64_t k = static_cast<int64_t>(shape.size());
  if (ran(kRmsNormBackward, all_take(input, grad, weight) && rstd.scalar_type() == at::kFloat &&
                                input.numel() > 0))
    return op.call(grad, input, shape, rstd.reshape(input.sizes().slice(0, input.dim() - k)), weight, mask, 0.0);
  return at::cuda::_fused_rms_norm_backward(grad, input, shape, rstd, weight, mask);
}

// isin takes every dtype both share (no promotion here: torch's kernel does it otherwise).
at::Tensor isin(const at::Tensor& elements, const at::Tensor& test, bool assume_unique, bool invert) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("tessera::isin", "")
                             .typed<at::Tensor(const at::Tensor&, const at::Tensor&, bool, bool,
                                               c10::string_view, int64_t, int64_t, int64_t)>();
  const IsinOptions o;
  const bool same = elements.is_cuda() && test.is_cuda() && elements.device() == test.device() &&
                    elements.scalar_type() == test.scalar_type();
  DType dt;
  if (ran(kIsin, same && dtype_of(elements.scalar_type(), dt)))
    return op.call(elements, test, assume_unique, invert, "automatic", o.brute_force_max_test,
                   o.brute_force_max_work, o.hash_min_test);
  return at::cuda::isin(elements, test, assume_unique, invert);
}

// ---- GEMMs: tessera's matmul op, where both operands are row- or column-major ----------------------

using MatmulSig = at::Tensor(const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
                             c10::string_view, double, std::optional<at::ScalarType>, std::optional<bool>);

const auto& matmul_op() {
  static const auto h = handle<MatmulSig>("matmul");
  return h;
}

// A unit stride in one of the two trailing dimensions: the layouts the tensor-core tiers read.
bool gemm_layout(const at::Tensor& t) {
  const int64_t d = t.dim();
  return t.stride(d - 1) == 1 || t.stride(d - 2) == 1;
}

bool gemm_takes(const at::Tensor& a, const at::Tensor& b, int64_t rank) {
  return all_take(a, b) && a.dim() == rank && b.dim() == rank && a.numel() > 0 && b.numel() > 0 &&
         gemm_layout(a) && gemm_layout(b);
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (ran(kMm, gemm_takes(self, mat2, 2)))
    return matmul_op().call(self, mat2, std::nullopt, std::nullopt, "none", 1.0, std::nullopt, std::nullopt);
  return at::cuda::mm(self, mat2);
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2) {
  if (ran(kBmm, gemm_takes(self, mat2, 3) && self.size(0) == mat2.size(0)))
    return matmul_op().call(self, mat2, std::nullopt, std::nullopt, "none", 1.0, std::nullopt, std::nullopt);
  return at::cuda::bmm(self, mat2);
}

// beta * self + alpha * (mat1 @ mat2): with beta 1, a bias row [N] is the epilogue's bias and a
// full [M, N] self its residual.
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  const bool plain = !beta.isComplex() && !alpha.isComplex() && beta.toDouble() == 1.0 &&
                     takes(mat1, self) && gemm_takes(mat1, mat2, 2);
  const int64_t n = mat2.dim() == 2 ? mat2.size(1) : -1;
  const bool row = plain && self.dim() == 1 && self.size(0) == n;
  const bool full = plain && self.dim() == 2 && self.size(0) == mat1.size(0) && self.size(1) == n;
  if (ran(kAddmm, row || full))
    return matmul_op().call(mat1, mat2, row ? OptTensor(self) : std::nullopt,
                            full ? OptTensor(self) : std::nullopt, "none", alpha.toDouble(),
                            std::nullopt, std::nullopt);
  return at::cuda::addmm(self, mat1, mat2, beta, alpha);
}

// ---- scaled_dot_product_attention: its cuDNN backend's ops (what F.scaled_dot_product_attention
// picks on Hopper), on tessera's attention where it takes the call --------------------------------
//
// The forward's lse goes only to the backward of the same call, so both decide alike from the same
// arguments: a routed forward has a routed backward (and torch's forward torch's backward), as long
// as routing is not switched between the two.

using Sdpa = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                        at::Tensor, at::Tensor>;

const auto& attention_op() {
  static const auto h = handle<Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                       std::optional<double>, int64_t, int64_t, double, bool, const OptTensor&)>(
      "attention");
  return h;
}
const auto& attention_backward_op() {
  static const auto h =
      handle<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                     const at::Tensor&, bool, std::optional<double>, int64_t, int64_t, double, bool, const OptTensor&)>(
          "attention_backward");
  return h;
}

// What tessera's attention takes of an SDPA call ([batch, heads, seq, head_dim] tensors): no mask,
// no dropout, causal only with seq_q = seq_k (torch's causal mask is top-left aligned otherwise).
bool sdpa_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool has_bias, double dropout,
                bool causal, std::optional<double> scale) {
  return !has_bias && dropout == 0.0 && all_take(q, k, v) && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 &&
         k.size(1) > 0 && q.size(1) % k.size(1) == 0 && (!causal || q.size(2) == k.size(2)) &&
         q.size(3) <= 256 && v.size(3) <= 256 && (!scale || *scale > 0);
}

Sdpa sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const OptTensor& bias, bool compute_lse,
          double dropout, bool causal, bool debug_mask, std::optional<double> scale) {
  const bool has_bias = bias && bias->defined();
  if (!ran(kSdpa, !debug_mask && sdpa_takes(q, k, v, has_bias, dropout, causal, scale)))
    return at::cuda::_scaled_dot_product_cudnn_attention(q, k, v, bias, compute_lse, dropout, causal, debug_mask,
                                                         scale);
  auto [out, lse] = attention_op().call(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal, scale, -1,
                                        -1, 0.0, at::globalContext().deterministicAlgorithms(), std::nullopt);
  const at::Tensor seed = at::zeros({}, q.options().dtype(at::kLong));
  return {out.transpose(1, 2), lse.unsqueeze(-1), at::Tensor(), at::Tensor(), c10::SymInt(q.size(2)),
          c10::SymInt(k.size(2)), seed, seed.clone(), at::Tensor()};
}

Tensor3 sdpa_backward(const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                      const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed, const at::Tensor& offset,
                      const at::Tensor& bias, const at::Tensor& cum_q, const at::Tensor& cum_k, c10::SymInt max_q,
                      c10::SymInt max_k, double dropout, bool causal, std::optional<double> scale) {
  if (!ran(kSdpaBackward, sdpa_takes(q, k, v, bias.defined(), dropout, causal, scale) && all_take(q, grad, out)))
    return at::cuda::_scaled_dot_product_cudnn_attention_backward(grad, q, k, v, out, lse, seed, offset, bias, cum_q,
                                                                  cum_k, max_q.expect_int(), max_k.expect_int(),
                                                                  dropout, causal, scale);
  auto [dq, dk, dv] = attention_backward_op().call(
      grad.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), out.transpose(1, 2),
      lse.squeeze(-1), causal, scale, -1, -1, 0.0, at::globalContext().deterministicAlgorithms(), std::nullopt);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

// F.cross_entropy (aten's cross_entropy_loss, which torch otherwise decomposes into log_softmax
// and nll_loss): tessera's fused loss and gradient for class-index targets without weights, the
// loss in the input's dtype as torch returns it; anything else torch's own decomposition.
at::Tensor cross_entropy_loss(const at::Tensor& self, const at::Tensor& target, const OptTensor& weight,
                              int64_t reduction, c10::SymInt ignore_index, double label_smoothing) {
  static const auto op = handle<Tensor3(const at::Tensor&, const at::Tensor&, const OptTensor&, int64_t,
                                        c10::string_view, double, double, double, bool)>("cross_entropy");
  const bool take = takes(self) && self.dim() == 2 && self.size(1) > 0 && target.dim() == 1 &&
                    target.scalar_type() == at::kLong && target.device() == self.device() &&
                    (!weight || !weight->defined()) && label_smoothing >= 0.0 && label_smoothing <= 1.0 &&
                    ignore_index.maybe_as_int().has_value();
  if (ran(kCrossEntropy, take)) {
    const char* r = reduction == at::Reduction::Mean ? "mean" : reduction == at::Reduction::Sum ? "sum" : "none";
    const at::Tensor loss =
        std::get<0>(op.call(self, target, OptTensor(), ignore_index.expect_int(), r, label_smoothing, 0.0, 0.0, false));
    return loss.to(self.scalar_type());
  }
  return at::native::cross_entropy_loss_symint(self, target, weight, reduction, std::move(ignore_index),
                                               label_smoothing);
}

void register_route(torch::Library& m, int r) {
  switch (r) {
    case kAdd: m.impl("add.Tensor", &add); break;
    case kGelu: m.impl("gelu", &gelu); break;
    case kGeluBackward: m.impl("gelu_backward", &gelu_backward); break;
    case kSilu: m.impl("silu", &silu); break;
    case kSiluBackward: m.impl("silu_backward", &silu_backward); break;
    case kSoftmax: m.impl("_softmax", &softmax<false>); break;
    case kLogSoftmax: m.impl("_log_softmax", &softmax<true>); break;
    case kSoftmaxBackward: m.impl("_softmax_backward_data", &softmax_backward<false>); break;
    case kLogSoftmaxBackward: m.impl("_log_softmax_backward_data", &softmax_backward<true>); break;
    case kLayerNorm: m.impl("native_layer_norm", &native_layer_norm); break;
    case kLayerNormBackward: m.impl("native_layer_norm_backward", &native_layer_norm_backward); break;
    case kRmsNorm: m.impl("_fused_rms_norm", &fused_rms_norm); break;
    case kRmsNormBackward: m.impl("_fused_rms_norm_backward", &fused_rms_norm_backward); break;
    case kIsin: m.impl("isin.Tensor_Tensor", &isin); break;
    case kMm: m.impl("mm", &mm); break;
    case kAddmm: m.impl("addmm", &addmm); break;
    case kBmm: m.impl("bmm", &bmm); break;
    case kSdpa: m.impl("_scaled_dot_product_cudnn_attention", &sdpa); break;
    case kSdpaBackward: m.impl("_scaled_dot_product_cudnn_attention_backward", &sdpa_backward); break;
    case kCrossEntropy: m.impl("cross_entropy_loss", &cross_entropy_loss); break;
  }
}

// ---- control (tessera._routing) ---------------------------------------------------------------------

// Routes exactly `ops` (names from route_names), replacing what was routed; [] routes none.
void route(std::vector<std::string> ops, bool log) {
  std::lock_guard<std::mutex> lock(mu);
  routes.reset();  // torch's kernels are back before the new set goes in
  autograd_routes.reset();
  for (auto& c : counts) c.store(0);
  counting.store(log);
  if (ops.empty()) return;
  routes = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CUDA,
                                            __FILE__, __LINE__);
  autograd_routes = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradCUDA,
                                                     __FILE__, __LINE__);
  for (const std::string& name : ops) {
    int r = 0;
    while (r < kCount && name != kRouted[r]) ++r;
    TORCH_CHECK_VALUE(r < kCount, "tessera.enable: no routable op '", name, "'");
    register_route(at_autograd(r) ? *autograd_routes : *routes, r);
  }
}

std::string route_names() {
  std::string s;
  for (int r = 0; r < kCount; ++r) s += (r ? "," : "") + std::string(kRouted[r]);
  return s;
}

std::vector<int64_t> route_counts() {
  std::vector<int64_t> v;
  for (const auto& c : counts) v.push_back(c.load());
  return v;
}

}  // namespace
}  // namespace tessera::torch_ops

// Control ops, not operators: no description, no tensors (a catch-all kernel each).
TORCH_LIBRARY_FRAGMENT(tessera, m) {
  m.def("_route(str[] ops, bool log) -> ()", &tessera::torch_ops::route);
  m.def("_route_names() -> str", &tessera::torch_ops::route_names);
  m.def("_route_counts() -> int[]", &tessera::torch_ops::route_counts);
}
