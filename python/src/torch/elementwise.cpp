// add's autograd, written by hand: a broadcast input's gradient is its output's summed back to its
// shape (torch's sum_to_size), which no tessera op computes. add's kernels, like every other
// elementwise op's, are the generic ones (generic.cpp), from the descriptions (src/ops/elementwise).
#include <torch/csrc/autograd/custom_function.h>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AddFunction : torch::autograd::Function<AddFunction> {
  static const auto& op() {
    static const auto h = handle<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("add");
    return h;
  }
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& other,
                            double alpha) {
    at::Tensor out = call_below_autograd(op(), input, other, alpha);
    if (alpha != 1.0) ctx->saved_data["alpha"] = alpha;
    // An argument's shape only where it was broadcast (its gradient is then summed back to it).
    if (input.sym_sizes() != out.sym_sizes()) ctx->saved_data["input"] = input.sym_sizes();
    if (other.sym_sizes() != out.sym_sizes()) ctx->saved_data["other"] = other.sym_sizes();
    return out;
  }
  // d/dinput = 1, d/dother = alpha, each summed over the dimensions it was broadcast along;
  // torch ops, so the backward is itself differentiable.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    const auto& data = ctx->saved_data;
    const auto a = data.find("alpha");
    const double alpha = a == data.end() ? 1.0 : a->second.toDouble();
    const auto summed = [&](const at::Tensor& t, const char* key) {
      const auto it = data.find(key);
      return it == data.end() ? t : t.sum_to_size_symint(it->second.toSymIntVector());
    };
    at::Tensor ga, gb;
    if (ctx->needs_input_grad(0)) ga = summed(g, "input");
    if (ctx->needs_input_grad(1)) gb = summed(alpha == 1.0 ? g : g.mul(alpha), "other");
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
}  // namespace
}  // namespace tessera::torch_ops

TORCH_LIBRARY_IMPL(tessera, Autograd, m) {
  using namespace tessera::torch_ops;
  m.impl("add", &add_autograd);
  m.impl("add.Scalar", &add_scalar_autograd);
}
