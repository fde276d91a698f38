// SwiGLU's gate: out = silu(gate) * up, forward and backward, each one pass over memory (the
// backward's two gradients from two maps that each read what they need).
//
// Bytes: 3n * sizeof(T) forward; backward 7n (grad_gate reads grad, gate, up; grad_up reads grad
// and gate).
#include "ops/elementwise/map.cuh"
#include "runtime/nvtx.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/activation.cuh"

namespace tessera {
namespace {

template <bool Fast>
struct SiluMul {
  __device__ __forceinline__ float operator()(float g, float u) const { return tile::Silu<Fast>{}(g) * u; }
};
// d/dgate: grad * up * silu'(gate).
template <bool Fast>
struct SiluMulGradGate {
  __device__ __forceinline__ float operator()(float dy, float g, float u) const {
    return tile::SiluBackward<Fast>{}(dy * u, g);
  }
};
// d/dup: grad * silu(gate).
template <bool Fast>
struct SiluMulGradUp {
  __device__ __forceinline__ float operator()(float dy, float g) const { return dy * tile::Silu<Fast>{}(g); }
};

void check_pair(const char* op, const TensorView& gate, const TensorView& up) {
  detail::check_cuda_tensor(op, "gate", gate);
  detail::check_dtype_in(op, "gate", gate, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "up", up, "gate", gate);
}

void check_out(const char* op, const char* name, const TensorView& out, const TensorView& gate,
               std::initializer_list<std::pair<const char*, const TensorView*>> ins) {
  detail::check_like(op, name, out, "gate", gate);
  detail::check_no_internal_overlap(op, name, out);
  for (const auto& [arg, t] : ins) detail::check_no_overlap(op, name, out, arg, *t, /*allow_identical=*/true);
}

}  // namespace

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_mul");
  check_pair("silu_mul", gate, up);
  check_out("silu_mul", "out", out, gate, {{"gate", &gate}, {"up", &up}});
  if (out.numel() == 0) return;
  elementwise::map_floats<SiluMul, 2>("silu_mul", out, {&gate, &up}, stream);
}

void silu_mul_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                       const TensorView& grad_gate, const TensorView& grad_up, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_mul_backward");
  const char* op = "silu_mul_backward";
  check_pair(op, gate, up);
  detail::check_like(op, "grad_output", grad_output, "gate", gate);
  const std::initializer_list<std::pair<const char*, const TensorView*>> ins = {
      {"grad_output", &grad_output}, {"gate", &gate}, {"up", &up}};
  check_out(op, "grad_gate", grad_gate, gate, ins);
  check_out(op, "grad_up", grad_up, gate, ins);
  detail::check_no_overlap(op, "grad_up", grad_up, "grad_gate", grad_gate, /*allow_identical=*/false);
  if (grad_gate.numel() == 0) return;
  // grad_up first: grad_gate may be grad_output itself (in place), which grad_up still reads.
  elementwise::map_floats<SiluMulGradUp, 2>(op, grad_up, {&grad_output, &gate}, stream);
  elementwise::map_floats<SiluMulGradGate, 3>(op, grad_gate, {&grad_output, &gate, &up}, stream);
}

namespace {
const OpRegistrar kSiluMul = describe("silu_mul", "elementwise", "SwiGLU's gate: silu(gate) * up")
    .schema("silu_mul(Tensor gate, Tensor up) -> Tensor")
    .kernel<&silu_mul>({"gate", "up", "out"}, {{"out", "gate"}})
    .differentiable("silu_mul_backward", {"grad", "gate", "up"}, {"gate", "up"});
const OpRegistrar kSiluMulBackward = describe("silu_mul_backward", "elementwise", "silu_mul backward: grad_gate, grad_up")
    .schema("silu_mul_backward(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor)")
    .kernel<&silu_mul_backward>({"grad_output", "gate", "up", "grad_gate", "grad_up"},
                                {{"grad_gate", "gate"}, {"grad_up", "up"}});
}  // namespace
}  // namespace tessera
