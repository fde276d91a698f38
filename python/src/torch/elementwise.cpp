// The elementwise family's torch kernels written by hand: add (broadcast shapes, a number as
// other), copy (writes its argument) and the gated backwards' .recompute (overloads: the generic
// kernel is the first schema's). Schemas: the descriptions' (src/ops/elementwise/*.cu);
// gelu, silu, dropout and their backwards take the generic kernels (generic.cpp).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

#include <tuple>
#include <vector>

#include "binding.hpp"
#include "fast.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// torch's broadcast of two shapes; false (and `out` unset) where they do not broadcast.
bool broadcast(at::IntArrayRef a, at::IntArrayRef b, std::vector<int64_t>& out) {
  const size_t n = std::max(a.size(), b.size());
  out.assign(n, 1);
  for (size_t i = 0; i < n; ++i) {
    const int64_t sa = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t sb = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (sa != sb && sa != 1 && sb != 1) return false;
    out[i] = sa == 1 ? sb : sa;
  }
  return true;
}

// ---- CUDA kernels ---------------------------------------------------------------------------------

at::Tensor add(const at::Tensor& input, const at::Tensor& other, double alpha) {
  const TensorView a = view("add", "input", input), b = view("add", "other", other);
  std::vector<int64_t> shape;
  // Shapes that do not broadcast: a 0-d stand-in output, which the library refuses by name
  // after its checks of devices and dtypes.
  const bool ok = broadcast(input.sizes(), other.sizes(), shape);
  at::Tensor out = at::empty(ok ? at::IntArrayRef(shape) : at::IntArrayRef{}, input.options());
  guarded([&] { tessera::add(a, b, view("add", "out", out), alpha, stream_of(input)); });
  return out;
}

at::Tensor add_scalar(const at::Tensor& input, double other, double alpha) {
  const TensorView a = view("add", "input", input);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  guarded([&] { tessera::add(a, other, view("add", "out", out), alpha, stream_of(input)); });
  return out;
}

void copy(const at::Tensor& src, const at::Tensor& dst) {
  const TensorView s = view("copy", "src", src), d = view("copy", "dst", dst);
  guarded([&] { tessera::copy(s, d, stream_of(src)); });
}

// (grad_input like input, output like grad_output), from one pass (mlp's backward): the gated
// activation's `recompute` backward, swiglu's or geglu's.
template <auto Fn>
std::tuple<at::Tensor, at::Tensor> gated_backward_recompute(const char* op, const at::Tensor& grad_output,
                                                            const at::Tensor& input) {
  const TensorView dy = view(op, "grad_output", grad_output), x = view(op, "input", input);
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor output = at::empty_like(grad_output, at::MemoryFormat::Contiguous);
  guarded([&] {
    Fn(dy, x, view(op, "grad_input", grad_input), view(op, "output", output), stream_of(input));
  });
  return {grad_input, output};
}
std::tuple<at::Tensor, at::Tensor> swiglu_backward_recompute(const at::Tensor& grad_output, const at::Tensor& input) {
  return gated_backward_recompute<&tessera::swiglu_backward_recompute>("swiglu_backward", grad_output, input);
}
std::tuple<at::Tensor, at::Tensor> geglu_blocks_backward_recompute(const at::Tensor& grad_output,
                                                                   const at::Tensor& input) {
  return gated_backward_recompute<&tessera::geglu_blocks_backward_recompute>("geglu_blocks_backward", grad_output,
                                                                             input);
}

// ---- autograd -------------------------------------------------------------------------------------

struct AddFunction : torch::autograd::Function<AddFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("add");
    return h;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& other,
                            double alpha) {
    ctx->saved_data["alpha"] = alpha;
    ctx->saved_data["input"] = input.sym_sizes();
    ctx->saved_data["other"] = other.sym_sizes();
    return call_below_autograd(op(), input, other, alpha);
  }
  // d/dinput = 1, d/dother = alpha, each summed over the dimensions it was broadcast along;
  // torch ops, so the backward is itself differentiable.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const double alpha = ctx->saved_data["alpha"].toDouble();
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = g.sum_to_size_symint(ctx->saved_data["input"].toSymIntVector());
    if (ctx->needs_input_grad(1))
      gb = (alpha == 1.0 ? g : g.mul(alpha)).sum_to_size_symint(ctx->saved_data["other"].toSymIntVector());
    return {ga, gb, at::Tensor()};
  }
};

struct AddScalarFunction : torch::autograd::Function<AddScalarFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&, double, double)>("add", "Scalar");
    return h;
  }
  static at::Tensor forward(AutogradContext*, const at::Tensor& input, double other, double alpha) {
    return call_below_autograd(op(), input, other, alpha);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

at::Tensor add_autograd(const at::Tensor& input, const at::Tensor& other, double alpha) {
  if (!records(input, other)) return call_below_autograd(AddFunction::op(), input, other, alpha);
  return AddFunction::apply(input, other, alpha);
}
at::Tensor add_scalar_autograd(const at::Tensor& input, double other, double alpha) {
  if (!records(input)) return call_below_autograd(AddScalarFunction::op(), input, other, alpha);
  return AddScalarFunction::apply(input, other, alpha);
}
void kernels(torch::Library& m) {
  m.impl("add", &add);
  m.impl("add.Scalar", &add_scalar);
  m.impl("copy", &copy);
  m.impl("swiglu_backward.recompute", &swiglu_backward_recompute);
  m.impl("geglu_blocks_backward.recompute", &geglu_blocks_backward_recompute);
}

}  // namespace
}  // namespace tessera::torch_ops

TESSERA_TORCH_KERNELS(tessera::torch_ops::kernels)

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops;
  m.impl("add", &add_autograd);
  m.impl("add.Scalar", &add_scalar_autograd);
}

namespace tessera::torch_ops::fast {
at::Tensor add(const at::Tensor& input, const at::Tensor& other, double alpha) {
  return torch_ops::add(input, other, alpha);
}
at::Tensor add_scalar(const at::Tensor& input, double other, double alpha) {
  return torch_ops::add_scalar(input, other, alpha);
}
}  // namespace tessera::torch_ops::fast
