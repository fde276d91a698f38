// GELU forward and backward, erf and tanh forms, as torch defines them.
//
// Bytes: 2n * sizeof(T) forward, 3n * sizeof(T) backward. At 8 bf16 elements per 16-byte load
// the arithmetic budget at copy bandwidth is ~30 instructions per element, so the math is kept
// short: half types use the MUFU exp/reciprocal, float32 the accurate library functions.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <type_traits>

#include "ops/elementwise/map.cuh"
#include "tile/activation.cuh"
#include "runtime/check.hpp"
#include "runtime/nvtx.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/op.hpp"

namespace tessera {
void gelu(const TensorView& x, const TensorView& out, GeluApproximate approximate,
          cudaStream_t stream) {
  runtime::NvtxRange range("tessera::gelu");
  if (!elementwise::check_map("gelu", x, out)) return;
  if (approximate == GeluApproximate::tanh)
    elementwise::map_floats<tile::GeluTanh, 1>("gelu", out, {&x}, stream);
  else
    elementwise::map_floats<tile::GeluErf, 1>("gelu", out, {&x}, stream);
}

void gelu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   GeluApproximate approximate, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::gelu_backward");
  if (!elementwise::check_map_backward("gelu_backward", grad_out, x, grad_in)) return;
  if (approximate == GeluApproximate::tanh)
    elementwise::map_floats<tile::GeluTanhBackward, 2>("gelu_backward", grad_in, {&grad_out, &x}, stream);
  else
    elementwise::map_floats<tile::GeluErfBackward, 2>("gelu_backward", grad_in, {&grad_out, &x}, stream);
}

}  // namespace tessera

namespace tessera {

void parse(const char* op, std::string_view name, GeluApproximate& out) {
  if (name == "none") out = GeluApproximate::none;
  else if (name == "tanh") out = GeluApproximate::tanh;
  else detail::throw_arg(ErrorKind::value, op, "approximate", "'none' or 'tanh'", "'" + std::string(name) + "'");
}

namespace {
const OpRegistrar kGelu = describe("gelu", "elementwise", "GELU forward: x * Phi(x), erf form or tanh approximation")
    .schema("gelu(Tensor input, *, str approximate='none') -> Tensor")
    .kernel<&gelu>({"input", "out", "approximate"}, {{"out", "input"}})
    .differentiable("gelu_backward", {"grad", "input", "approximate"}, {"input"})
    .torch("torch.nn.functional.gelu");
const OpRegistrar kGeluBackward = describe("gelu_backward", "elementwise", "GELU backward: grad_output * gelu'(x)")
    .schema("gelu_backward(Tensor grad_output, Tensor input, *, str approximate='none') -> Tensor")
    .kernel<&gelu_backward>({"grad_output", "input", "out", "approximate"}, {{"out", "input"}})
    .torch("torch.ops.aten.gelu_backward");
}  // namespace
}  // namespace tessera
