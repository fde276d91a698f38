// The elementwise family as torch ops: add, gelu, silu (and their backwards), dropout (and its
// backward), copy. Schemas: the descriptions' (src/ops/elementwise/*_cases.cpp).
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/csrc/autograd/custom_function.h>

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

GeluApproximate approximate_of(c10::string_view s) {
  if (s == "none") return GeluApproximate::none;
  if (s == "tanh") return GeluApproximate::tanh;
  TORCH_CHECK_VALUE(false, "tessera.gelu: argument 'approximate': expected 'none' or 'tanh', got '",
                    std::string(s), "'");
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

at::Tensor gelu(const at::Tensor& input, c10::string_view approximate) {
  const TensorView x = view("gelu", "input", input);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::gelu(x, view("gelu", "out", out), approximate_of(approximate), stream_of(input));
  });
  return out;
}

at::Tensor gelu_backward(const at::Tensor& grad_output, const at::Tensor& input,
                         c10::string_view approximate) {
  const TensorView g = view("gelu_backward", "grad_output", grad_output);
  const TensorView x = view("gelu_backward", "input", input);
  at::Tensor out = at::empty_like(grad_output, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::gelu_backward(g, x, view("gelu_backward", "out", out), approximate_of(approximate),
                           stream_of(grad_output));
  });
  return out;
}

at::Tensor silu(const at::Tensor& input) {
  const TensorView x = view("silu", "input", input);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  guarded([&] { tessera::silu(x, view("silu", "out", out), stream_of(input)); });
  return out;
}

at::Tensor silu_backward(const at::Tensor& grad_output, const at::Tensor& input) {
  const TensorView g = view("silu_backward", "grad_output", grad_output);
  const TensorView x = view("silu_backward", "input", input);
  at::Tensor out = at::empty_like(grad_output, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::silu_backward(g, x, view("silu_backward", "out", out), stream_of(grad_output));
  });
  return out;
}

at::Tensor dropout(const at::Tensor& input, double p, int64_t seed, int64_t offset) {
  const TensorView x = view("dropout", "input", input);
  at::Tensor out = at::empty_like(input, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::dropout(x, view("dropout", "out", out), p, static_cast<uint64_t>(seed),
                     static_cast<uint64_t>(offset), stream_of(input));
  });
  return out;
}

at::Tensor dropout_backward(const at::Tensor& grad_output, double p, int64_t seed, int64_t offset) {
  const TensorView g = view("dropout_backward", "grad_output", grad_output);
  at::Tensor out = at::empty_like(grad_output, at::MemoryFormat::Contiguous);
  guarded([&] {
    tessera::dropout_backward(g, view("dropout_backward", "out", out), p,
                              static_cast<uint64_t>(seed), static_cast<uint64_t>(offset),
                              stream_of(grad_output));
  });
  return out;
}

void copy(const at::Tensor& src, const at::Tensor& dst) {
  const TensorView s = view("copy", "src", src), d = view("copy", "dst", dst);
  guarded([&] { tessera::copy(s, d, stream_of(src)); });
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

// gelu and silu: save the input, run the backward op on the gradient.
struct GeluFunction : torch::autograd::Function<GeluFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&, c10::string_view)>("gelu");
    return h;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input,
                            c10::string_view approximate) {
    ctx->save_for_backward({input});
    ctx->saved_data["approximate"] = std::string(approximate);
    return call_below_autograd(op(), input, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, c10::string_view)>(
        "gelu_backward");
    const std::string approximate = ctx->saved_data["approximate"].toStringRef();
    return {op.call(grads[0].contiguous(), ctx->get_saved_variables()[0], approximate), at::Tensor()};
  }
};

struct SiluFunction : torch::autograd::Function<SiluFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&)>("silu");
    return h;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input) {
    ctx->save_for_backward({input});
    return call_below_autograd(op(), input);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("silu_backward");
    return {op.call(grads[0].contiguous(), ctx->get_saved_variables()[0])};
  }
};

// dropout keeps no mask: the backward regenerates it from (seed, offset).
struct DropoutFunction : torch::autograd::Function<DropoutFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&, double, int64_t, int64_t)>("dropout");
    return h;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, double p, int64_t seed,
                            int64_t offset) {
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["offset"] = offset;
    return call_below_autograd(op(), input, p, seed, offset);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op =
        handle<at::Tensor(const at::Tensor&, double, int64_t, int64_t)>("dropout_backward");
    return {op.call(grads[0].contiguous(), ctx->saved_data["p"].toDouble(),
                    ctx->saved_data["seed"].toInt(), ctx->saved_data["offset"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor()};
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
at::Tensor gelu_autograd(const at::Tensor& input, c10::string_view approximate) {
  if (!records(input)) return call_below_autograd(GeluFunction::op(), input, approximate);
  return GeluFunction::apply(input, approximate);
}
at::Tensor silu_autograd(const at::Tensor& input) {
  if (!records(input)) return call_below_autograd(SiluFunction::op(), input);
  return SiluFunction::apply(input);
}
at::Tensor dropout_autograd(const at::Tensor& input, double p, int64_t seed, int64_t offset) {
  if (!records(input)) return call_below_autograd(DropoutFunction::op(), input, p, seed, offset);
  return DropoutFunction::apply(input, p, seed, offset);
}

void kernels(torch::Library& m) {
  m.impl("add", &add);
  m.impl("add.Scalar", &add_scalar);
  m.impl("gelu", &gelu);
  m.impl("gelu_backward", &gelu_backward);
  m.impl("silu", &silu);
  m.impl("silu_backward", &silu_backward);
  m.impl("dropout", &dropout);
  m.impl("dropout_backward", &dropout_backward);
  m.impl("copy", &copy);
}

}  // namespace
}  // namespace tessera::torch_ops

// CPU tensors reach the same kernels, for the library's own message (a CUDA tensor expected).
TORCH_LIBRARY_IMPL(tessera, CUDA, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, CPU, m) { tessera::torch_ops::kernels(m); }

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops;
  m.impl("add", &add_autograd);
  m.impl("add.Scalar", &add_scalar_autograd);
  m.impl("gelu", &gelu_autograd);
  m.impl("silu", &silu_autograd);
  m.impl("dropout", &dropout_autograd);
}

namespace tessera::torch_ops::fast {
at::Tensor add(const at::Tensor& input, const at::Tensor& other, double alpha) {
  return torch_ops::add(input, other, alpha);
}
at::Tensor add_scalar(const at::Tensor& input, double other, double alpha) {
  return torch_ops::add_scalar(input, other, alpha);
}
at::Tensor gelu(const at::Tensor& input, bool tanh) {
  return torch_ops::gelu(input, tanh ? "tanh" : "none");
}
at::Tensor silu(const at::Tensor& input) { return torch_ops::silu(input); }
}  // namespace tessera::torch_ops::fast
