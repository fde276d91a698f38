// SiLU (swish) forward and backward, as torch.nn.functional.silu: x * sigmoid(x).
//
// Bytes: 2n * sizeof(T) forward, 3n * sizeof(T) backward; one exp and one division per element,
// far under the memory time.
#include "ops/elementwise/map.cuh"
#include "tile/activation.cuh"
#include "runtime/nvtx.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tessera/op.hpp"

namespace tessera {
void silu(const TensorView& x, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu");
  if (!elementwise::check_map("silu", x, out)) return;
  elementwise::map_floats<tile::Silu, 1>("silu", out, {&x}, stream);
}

void silu_backward(const TensorView& grad_out, const TensorView& x, const TensorView& grad_in,
                   cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_backward");
  if (!elementwise::check_map_backward("silu_backward", grad_out, x, grad_in)) return;
  elementwise::map_floats<tile::SiluBackward, 2>("silu_backward", grad_in, {&grad_out, &x}, stream);
}

}  // namespace tessera

namespace tessera {
namespace {
const OpRegistrar kSilu = describe("silu", "elementwise", "SiLU forward: x * sigmoid(x)")
    .schema("silu(Tensor input) -> Tensor")
    .kernel<&silu>({"input", "out"}, {{"out", "input"}})
    .differentiable("silu_backward", {"grad", "input"}, {"input"})
    .torch("torch.nn.functional.silu");
const OpRegistrar kSiluBackward = describe("silu_backward", "elementwise", "SiLU backward: grad_output * silu'(x)")
    .schema("silu_backward(Tensor grad_output, Tensor input) -> Tensor")
    .kernel<&silu_backward>({"grad_output", "input", "out"}, {{"out", "input"}})
    .torch("torch.ops.aten.silu_backward");
}  // namespace
}  // namespace tessera
