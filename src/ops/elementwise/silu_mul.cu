// The gated products of a feed-forward, out = act(gate) * up, forward and backward, each one pass
// over memory (the backward's two gradients from one map with two outputs; with the forward's
// output recomputed, three): SwiGLU's silu_mul and GeGLU's geglu (Gemma's tanh-GELU), one
// template with the activation as its row.
//
// Bytes: 3n * sizeof(T) forward; backward 5n (grad, gate and up read, grad_gate and grad_up
// written), 6n with the forward's output (the _recompute backwards).
#include <string>

#include "ops/elementwise/map.cuh"
#include "runtime/nvtx.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/elementwise.hpp"
#include "tile/activation.cuh"

namespace tessera {
namespace {

// act(gate) * up for an activation Act and its backward ActGrad (ActGrad(dy, x) = dy * act'(x)).
template <template <bool> class Act, template <bool> class ActGrad>
struct Gated {
  template <bool Fast>
  struct Mul {
    __device__ __forceinline__ float operator()(float g, float u) const { return Act<Fast>{}(g) * u; }
  };
  // d/dgate = grad * up * act'(gate), d/dup = grad * act(gate).
  template <bool Fast>
  struct Grads {
    __device__ __forceinline__ tile::Floats<2> operator()(float dy, float g, float u) const {
      return {{ActGrad<Fast>{}(dy * u, g), dy * Act<Fast>{}(g)}};
    }
  };
  // The same gradients and the forward's output, act(gate) * up, from one read of gate and up.
  template <bool Fast>
  struct GradsAndOutput {
    __device__ __forceinline__ tile::Floats<3> operator()(float dy, float g, float u) const {
      const float a = Act<Fast>{}(g);
      return {{ActGrad<Fast>{}(dy * u, g), dy * a, a * u}};
    }
  };
};
using SiluGate = Gated<tile::Silu, tile::SiluBackward>;
using GeluTanhGate = Gated<tile::GeluTanh, tile::GeluTanhBackward>;

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

template <class Gate>
void gated_mul(const char* op, const TensorView& gate, const TensorView& up, const TensorView& out,
               cudaStream_t stream) {
  check_pair(op, gate, up);
  check_out(op, "out", out, gate, {{"gate", &gate}, {"up", &up}});
  if (out.numel() == 0) return;
  elementwise::map_floats<Gate::template Mul, 2>(op, out, {&gate, &up}, stream);
}

// The gradients, and with `out` the forward's output recomputed (one pass: 3 reads, 3 writes).
template <class Gate>
void gated_mul_backward(const char* op, const TensorView& grad_output, const TensorView& gate,
                        const TensorView& up, const TensorView& grad_gate, const TensorView& grad_up,
                        const TensorView* out, cudaStream_t stream) {
  check_pair(op, gate, up);
  detail::check_like(op, "grad_output", grad_output, "gate", gate);
  const std::initializer_list<std::pair<const char*, const TensorView*>> ins = {
      {"grad_output", &grad_output}, {"gate", &gate}, {"up", &up}};
  check_out(op, "grad_gate", grad_gate, gate, ins);
  check_out(op, "grad_up", grad_up, gate, ins);
  detail::check_no_overlap(op, "grad_up", grad_up, "grad_gate", grad_gate, /*allow_identical=*/false);
  if (out) {
    check_out(op, "out", *out, gate, ins);
    detail::check_no_overlap(op, "out", *out, "grad_gate", grad_gate, /*allow_identical=*/false);
    detail::check_no_overlap(op, "out", *out, "grad_up", grad_up, /*allow_identical=*/false);
  }
  if (grad_gate.numel() == 0) return;
  // Each element's inputs are read before its outputs are written, so an output may be an input
  // itself (in place).
  if (out)
    elementwise::map_floats<Gate::template GradsAndOutput, 3, 3>(op, {&grad_gate, &grad_up, out},
                                                                 {&grad_output, &gate, &up}, stream);
  else
    elementwise::map_floats<Gate::template Grads, 3, 2>(op, {&grad_gate, &grad_up}, {&grad_output, &gate, &up},
                                                        stream);
}

}  // namespace

void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_mul");
  gated_mul<SiluGate>("silu_mul", gate, up, out, stream);
}

void silu_mul_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                       const TensorView& grad_gate, const TensorView& grad_up, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_mul_backward");
  gated_mul_backward<SiluGate>("silu_mul_backward", grad_output, gate, up, grad_gate, grad_up, nullptr, stream);
}

void silu_mul_backward_recompute(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                                 const TensorView& grad_gate, const TensorView& grad_up, const TensorView& out,
                                 cudaStream_t stream) {
  runtime::NvtxRange range("tessera::silu_mul_backward_recompute");
  gated_mul_backward<SiluGate>("silu_mul_backward_recompute", grad_output, gate, up, grad_gate, grad_up, &out,
                               stream);
}

void geglu(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu");
  gated_mul<GeluTanhGate>("geglu", gate, up, out, stream);
}

void geglu_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                    const TensorView& grad_gate, const TensorView& grad_up, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu_backward");
  gated_mul_backward<GeluTanhGate>("geglu_backward", grad_output, gate, up, grad_gate, grad_up, nullptr, stream);
}

void geglu_backward_recompute(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                              const TensorView& grad_gate, const TensorView& grad_up, const TensorView& out,
                              cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu_backward_recompute");
  gated_mul_backward<GeluTanhGate>("geglu_backward_recompute", grad_output, gate, up, grad_gate, grad_up, &out,
                                   stream);
}

namespace {

// A view [..., N / block, block] of t [..., N]: its last dimension's blocks as a dimension, from
// the column `first` on (gate: 0, up: kSwigluBlock), every `step`-th block.
TensorView blocks_of(const TensorView& t, int64_t block, int64_t step, int64_t first) {
  int64_t shape[kMaxDims], strides[kMaxDims];
  const int last = t.ndim - 1;
  for (int d = 0; d < last; ++d) shape[d] = t.shape[d], strides[d] = t.strides[d];
  shape[last] = t.shape[last] / (block * step), strides[last] = block * step * t.strides[last];
  shape[last + 1] = block, strides[last + 1] = t.strides[last];
  void* data = static_cast<char*>(t.data) + first * t.strides[last] * int64_t(dtype_size(t.dtype));
  return TensorView::make(data, t.dtype, shape, strides, t.ndim + 1, t.device);
}

// Columns [first, first + count) of t's last dimension.
TensorView cols_of(const TensorView& t, int64_t first, int64_t count) {
  TensorView v = t;
  v.shape[t.ndim - 1] = count;
  v.data = static_cast<char*>(t.data) + first * t.strides[t.ndim - 1] * int64_t(dtype_size(t.dtype));
  return v;
}

// A tensor of the gated layout [..., 2F] (`gated`: the gates, which = 0, or the ups, which = 1) or
// of its features [..., F], as its whole blocks of 64 features [..., F / 64, 64] and the last,
// shorter block's F % 64 (whose gate and up columns follow one another the same way).
struct Split {
  TensorView blocks, tail;
};
Split split(const TensorView& t, int64_t f, bool gated, int which) {
  const int64_t r = f % kSwigluBlock, whole = (f - r) * (gated ? 2 : 1);
  return {blocks_of(cols_of(t, 0, whole), kSwigluBlock, gated ? 2 : 1, gated ? which * kSwigluBlock : 0),
          cols_of(t, whole + (gated ? which * r : 0), r)};
}

// input [..., N] with N = 2F even (gate and up in blocks of 64 features, the last block F % 64);
// `other` (named `other_name`) [..., N / div].
void check_interleaved(const char* op, const TensorView& input, const char* other_name, const TensorView& other,
                       int64_t div) {
  detail::check_cuda_tensor(op, "input", input);
  detail::check_dtype_in(op, "input", input, {DType::float32, DType::float16, DType::bfloat16});
  if (input.ndim < 1 || input.ndim >= kMaxDims || input.shape[input.ndim - 1] % 2 != 0)
    detail::throw_arg(ErrorKind::value, op, "input",
                      "1 to 7 dimensions, the last even (gate and up in blocks of 64 features)",
                      input.shape_str());
  detail::check_same_dtype(op, other_name, other, "input", input);
  detail::check_same_device(op, other_name, other, "input", input);
  bool ok = other.ndim == input.ndim && other.shape[other.ndim - 1] * div == input.shape[input.ndim - 1];
  for (int d = 0; ok && d + 1 < input.ndim; ++d) ok = other.shape[d] == input.shape[d];
  if (!ok) {
    std::string want = "[";
    for (int d = 0; d + 1 < input.ndim; ++d) want += std::to_string(input.shape[d]) + ", ";
    want += std::to_string(input.shape[input.ndim - 1] / div) + "]";
    detail::throw_arg(ErrorKind::value, op, other_name, want, other.shape_str());
  }
}

// The gated forms on the interleaved layout, a Gate per activation (SiluGate: swiglu, GeluTanhGate:
// geglu_blocks).
template <class Gate>
void gated_blocks(const char* op, const TensorView& input, const TensorView& out, cudaStream_t stream) {
  check_interleaved(op, input, "out", out, 2);
  detail::check_no_internal_overlap(op, "out", out);
  detail::check_no_overlap(op, "out", out, "input", input, /*allow_identical=*/false);
  if (out.numel() == 0) return;
  const int64_t f = input.shape[input.ndim - 1] / 2;
  const Split gate = split(input, f, true, 0), up = split(input, f, true, 1), o = split(out, f, false, 0);
  if (f >= kSwigluBlock) elementwise::map_floats<Gate::template Mul, 2>(op, o.blocks, {&gate.blocks, &up.blocks}, stream);
  if (f % kSwigluBlock) elementwise::map_floats<Gate::template Mul, 2>(op, o.tail, {&gate.tail, &up.tail}, stream);
}

// The gradient of input, and with `output` the forward's output recomputed from the same read.
template <class Gate>
void gated_blocks_backward(const char* op, const TensorView& grad_output, const TensorView& input,
                           const TensorView& grad_input, const TensorView* output, cudaStream_t stream) {
  check_interleaved(op, input, "grad_output", grad_output, 2);
  check_interleaved(op, input, "grad_input", grad_input, 1);
  detail::check_no_internal_overlap(op, "grad_input", grad_input);
  detail::check_no_overlap(op, "grad_input", grad_input, "input", input, /*allow_identical=*/true);
  detail::check_no_overlap(op, "grad_input", grad_input, "grad_output", grad_output, /*allow_identical=*/false);
  if (output) {
    check_interleaved(op, input, "output", *output, 2);
    detail::check_no_internal_overlap(op, "output", *output);
    detail::check_no_overlap(op, "output", *output, "grad_output", grad_output, /*allow_identical=*/true);
    detail::check_no_overlap(op, "output", *output, "input", input, /*allow_identical=*/false);
    detail::check_no_overlap(op, "output", *output, "grad_input", grad_input, /*allow_identical=*/false);
  }
  if (grad_input.numel() == 0) return;
  const int64_t f = input.shape[input.ndim - 1] / 2;
  const Split gate = split(input, f, true, 0), up = split(input, f, true, 1);
  const Split dgate = split(grad_input, f, true, 0), dup = split(grad_input, f, true, 1);
  const Split dy = split(grad_output, f, false, 0);
  const Split out = output ? split(*output, f, false, 0) : Split{};
  // The whole blocks, then the last, shorter one.
  for (bool tail : {false, true}) {
    if (tail ? f % kSwigluBlock == 0 : f < kSwigluBlock) continue;
    const auto pick = [tail](const Split& s) { return tail ? &s.tail : &s.blocks; };
    if (output)
      elementwise::map_floats<Gate::template GradsAndOutput, 3, 3>(op, {pick(dgate), pick(dup), pick(out)},
                                                                   {pick(dy), pick(gate), pick(up)}, stream);
    else
      elementwise::map_floats<Gate::template Grads, 3, 2>(op, {pick(dgate), pick(dup)},
                                                          {pick(dy), pick(gate), pick(up)}, stream);
  }
}

}  // namespace

void swiglu(const TensorView& input, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::swiglu");
  gated_blocks<SiluGate>("swiglu", input, out, stream);
}

void swiglu_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                     cudaStream_t stream) {
  runtime::NvtxRange range("tessera::swiglu_backward");
  gated_blocks_backward<SiluGate>("swiglu_backward", grad_output, input, grad_input, nullptr, stream);
}

void swiglu_backward_recompute(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                               const TensorView& output, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::swiglu_backward_recompute");
  gated_blocks_backward<SiluGate>("swiglu_backward", grad_output, input, grad_input, &output, stream);
}

void geglu_blocks(const TensorView& input, const TensorView& out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu_blocks");
  gated_blocks<GeluTanhGate>("geglu_blocks", input, out, stream);
}

void geglu_blocks_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                           cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu_blocks_backward");
  gated_blocks_backward<GeluTanhGate>("geglu_blocks_backward", grad_output, input, grad_input, nullptr, stream);
}

void geglu_blocks_backward_recompute(const TensorView& grad_output, const TensorView& input,
                                     const TensorView& grad_input, const TensorView& output, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::geglu_blocks_backward_recompute");
  gated_blocks_backward<GeluTanhGate>("geglu_blocks_backward", grad_output, input, grad_input, &output, stream);
}

namespace {
const OpRegistrar kSwigluBackward = describe("swiglu_backward", "elementwise",
                                             "swiglu backward (gate and up interleaved in blocks of 64): grad_input")
    .schema("swiglu_backward(Tensor grad_output, Tensor input) -> Tensor")
    .kernel<&swiglu_backward>({"grad_output", "input", "grad_input"}, {{"grad_input", "input"}})
    // grad_input and the forward's output recomputed in the same pass (mlp's backward)
    .overload(describe("swiglu_backward.recompute", "elementwise", "swiglu backward with the forward's output")
                  .schema("swiglu_backward.recompute(Tensor grad_output, Tensor input) -> "
                          "(Tensor grad_input, Tensor output)")
                  .kernel<&swiglu_backward_recompute>({"grad_output", "input", "grad_input", "output"},
                                                      {{"grad_input", "input"}, {"output", "grad_output"}}));
const OpRegistrar kGegluBlocksBackward =
    describe("geglu_blocks_backward", "elementwise",
             "matmul's activation 'geglu' backward (gate and up interleaved in blocks of 64): grad_input")
        .schema("geglu_blocks_backward(Tensor grad_output, Tensor input) -> Tensor")
        .kernel<&geglu_blocks_backward>({"grad_output", "input", "grad_input"}, {{"grad_input", "input"}})
        .overload(describe("geglu_blocks_backward.recompute", "elementwise",
                           "geglu_blocks backward with the forward's output")
                      .schema("geglu_blocks_backward.recompute(Tensor grad_output, Tensor input) -> "
                              "(Tensor grad_input, Tensor output)")
                      .kernel<&geglu_blocks_backward_recompute>({"grad_output", "input", "grad_input", "output"},
                                                                {{"grad_input", "input"}, {"output", "grad_output"}}));
const OpRegistrar kSiluMul = describe("silu_mul", "elementwise", "SwiGLU's gate: silu(gate) * up")
    .schema("silu_mul(Tensor gate, Tensor up) -> Tensor")
    .kernel<&silu_mul>({"gate", "up", "out"}, {{"out", "gate"}})
    .differentiable("silu_mul_backward", {"grad", "gate", "up"}, {"gate", "up"});
const OpRegistrar kSiluMulBackward = describe("silu_mul_backward", "elementwise", "silu_mul backward: grad_gate, grad_up")
    .schema("silu_mul_backward(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor)")
    .kernel<&silu_mul_backward>({"grad_output", "gate", "up", "grad_gate", "grad_up"},
                                {{"grad_gate", "gate"}, {"grad_up", "up"}});
const OpRegistrar kSiluMulBackwardRecompute =
    describe("silu_mul_backward_recompute", "elementwise",
             "silu_mul backward with the forward's output recomputed: grad_gate, grad_up, out")
        .schema("silu_mul_backward_recompute(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor, Tensor)")
        .kernel<&silu_mul_backward_recompute>({"grad_output", "gate", "up", "grad_gate", "grad_up", "out"},
                                              {{"grad_gate", "gate"}, {"grad_up", "up"}, {"out", "gate"}});
const OpRegistrar kGeglu = describe("geglu", "elementwise", "GeGLU's gate: gelu_tanh(gate) * up")
    .schema("geglu(Tensor gate, Tensor up) -> Tensor")
    .kernel<&geglu>({"gate", "up", "out"}, {{"out", "gate"}})
    .differentiable("geglu_backward", {"grad", "gate", "up"}, {"gate", "up"});
const OpRegistrar kGegluBackward = describe("geglu_backward", "elementwise", "geglu backward: grad_gate, grad_up")
    .schema("geglu_backward(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor)")
    .kernel<&geglu_backward>({"grad_output", "gate", "up", "grad_gate", "grad_up"},
                             {{"grad_gate", "gate"}, {"grad_up", "up"}});
const OpRegistrar kGegluBackwardRecompute =
    describe("geglu_backward_recompute", "elementwise",
             "geglu backward with the forward's output recomputed: grad_gate, grad_up, out")
        .schema("geglu_backward_recompute(Tensor grad_output, Tensor gate, Tensor up) -> (Tensor, Tensor, Tensor)")
        .kernel<&geglu_backward_recompute>({"grad_output", "gate", "up", "grad_gate", "grad_up", "out"},
                                           {{"grad_gate", "gate"}, {"grad_up", "up"}, {"out", "gate"}});
}  // namespace
}  // namespace tessera
