// The matrix family as torch ops: matmul (the library's 2-d/3-d operands; the Python layer views
// torch.matmul's shapes as these) and scaled_mm. Schemas: the descriptions'
// (src/ops/matrix/matmul_cases.cpp).
#include <ATen/Context.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "binding.hpp"

namespace tessera::torch_ops {
namespace {

using OptTensor = std::optional<at::Tensor>;

Activation activation_of(c10::string_view name) {
  for (Activation a : {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh,
                       Activation::silu})
    if (name == activation_name(a)) return a;
  TORCH_CHECK_VALUE(false, "tessera.matmul: argument 'activation': expected None, 'relu', 'gelu', "
                    "'gelu_tanh' or 'silu', got '", std::string(name), "'");
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

at::Tensor matmul(const at::Tensor& input, const at::Tensor& other, const OptTensor& bias,
                  const OptTensor& residual, c10::string_view activation, double alpha,
                  std::optional<at::ScalarType> out_dtype, std::optional<bool> allow_tf32) {
  MatmulOptions o;
  o.activation = activation_of(activation);
  o.alpha = alpha;
  // torch.get_float32_matmul_precision() != "highest", as torch.matmul reads it.
  o.allow_tf32 = allow_tf32.value_or(at::globalContext().float32MatmulPrecision() !=
                                     at::Float32MatmulPrecision::HIGHEST);
  TensorView b, r;
  const TensorView a = view("matmul", "input", input), bv = view("matmul", "other", other);
  o.bias = optional_view("matmul", "bias", bias, b);
  o.residual = optional_view("matmul", "residual", residual, r);
  at::Tensor out = at::empty(product_shape(input, other),
                             input.options().dtype(out_dtype.value_or(input.scalar_type())));
  guarded([&] { tessera::matmul(a, bv, view("matmul", "out", out), o, stream_of(input)); });
  return out;
}

at::Tensor scaled_mm(const at::Tensor& input, const at::Tensor& other, const at::Tensor& scale_a,
                     const at::Tensor& scale_b, const OptTensor& bias,
                     std::optional<at::ScalarType> out_dtype) {
  const char* op = "scaled_mm";
  TensorView b;
  const TensorView a = view(op, "input", input), bv = view(op, "other", other);
  const TensorView sa = view(op, "scale_a", scale_a), sb = view(op, "scale_b", scale_b);
  const TensorView* bp = optional_view(op, "bias", bias, b);
  const bool ok = input.dim() == 2 && other.dim() == 2;
  at::Tensor out = at::empty(ok ? std::vector<int64_t>{input.size(0), other.size(1)} : std::vector<int64_t>{},
                             input.options().dtype(out_dtype.value_or(at::kBFloat16)));
  guarded([&] { tessera::scaled_mm(a, bv, sa, sb, view(op, "out", out), bp, stream_of(input)); });
  return out;
}

void kernels(torch::Library& m) {
  m.impl("matmul", &matmul);
  m.impl("scaled_mm", &scaled_mm);
}

}  // namespace
}  // namespace tessera::torch_ops

TORCH_LIBRARY_IMPL(tessera, CUDA, m) { tessera::torch_ops::kernels(m); }
TORCH_LIBRARY_IMPL(tessera, CPU, m) { tessera::torch_ops::kernels(m); }
