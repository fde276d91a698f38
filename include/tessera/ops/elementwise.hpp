// Elementwise operators. Every function checks its arguments (throwing tessera::Error before any
// launch), returns at once for 0-element tensors, and enqueues its kernels on `stream`.
// Supported dtypes: float32, float16, bfloat16 (half types compute in float32).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "tessera/tensor.hpp"

namespace tessera {

// out = input + alpha * other. input and other broadcast to out's shape with torch's rules (a
// scalar, a tensor over leading dims, or any broadcastable shape); all three share one dtype and
// one device. out may be input itself (same layout) for in-place use; any other overlap with an
// input is refused.
void add(const TensorView& input, const TensorView& other, const TensorView& out, double alpha,
         cudaStream_t stream);
// out = input + alpha * other for a host scalar other.
void add(const TensorView& input, double other, const TensorView& out, double alpha,
         cudaStream_t stream);

enum class GeluApproximate { none, tanh };  // erf form, or torch's tanh approximation
// From torch's spelling, "none" or "tanh"; otherwise tessera::Error naming op's `approximate`.
void parse(const char* op, std::string_view name, GeluApproximate& out);

// out = gelu(input); out has input's shape and dtype.
void gelu(const TensorView& input, const TensorView& out, GeluApproximate approximate,
          cudaStream_t stream);
// out = grad_output * gelu'(input); all three share one shape and dtype.
void gelu_backward(const TensorView& grad_output, const TensorView& input, const TensorView& out,
                   GeluApproximate approximate, cudaStream_t stream);

// out = silu(input) = input * sigmoid(input); out has input's shape and dtype.
void silu(const TensorView& input, const TensorView& out, cudaStream_t stream);
// out = grad_output * silu'(input); all three share one shape and dtype.
void silu_backward(const TensorView& grad_output, const TensorView& input, const TensorView& out,
                   cudaStream_t stream);

// SwiGLU's gate, out = silu(gate) * up (gate, up and out of one shape and float dtype, any
// layout), and its gradients grad_gate = grad_output * up * silu'(gate), grad_up = grad_output *
// silu(gate).
void silu_mul(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream);
void silu_mul_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                       const TensorView& grad_gate, const TensorView& grad_up, cudaStream_t stream);

// GeGLU's gate (Gemma's feed-forward), out = gelu_tanh(gate) * up with GELU's tanh form, and its
// gradients grad_gate = grad_output * up * gelu_tanh'(gate), grad_up = grad_output *
// gelu_tanh(gate); as silu_mul otherwise.
void geglu(const TensorView& gate, const TensorView& up, const TensorView& out, cudaStream_t stream);
void geglu_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                    const TensorView& grad_gate, const TensorView& grad_up, cudaStream_t stream);

// The backwards with the forward's output recomputed in the same pass, for a caller that did not
// keep it (a feed-forward whose down projection needs it again): also out = act(gate) * up.
void silu_mul_backward_recompute(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                                 const TensorView& grad_gate, const TensorView& grad_up, const TensorView& out,
                                 cudaStream_t stream);
void geglu_backward_recompute(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                              const TensorView& grad_gate, const TensorView& grad_up, const TensorView& out,
                              cudaStream_t stream);

// The same on one tensor whose last dimension interleaves gate and up in blocks of kSwigluBlock
// features: columns 128 j .. 128 j + 63 are the gate of features 64 j .. 64 j + 63, the next 64
// their up; where F = N / 2 is not a multiple of 64 the last block is F % 64 wide (its gate
// columns, then its up). That is the product of a weight whose rows are so interleaved (matmul's
// gated activations; tessera.swiglu_weight builds one from the gate's and the up projection's).
// swiglu: input [..., N] (N even) to out [..., N / 2]; swiglu_backward: grad_output [..., N / 2]
// and input to grad_input [..., N], interleaved like input. Any strides.
inline constexpr int64_t kSwigluBlock = 64;
// In that layout of F features: the column of feature j's gate, and the width of its block (its
// up is that many columns on).
inline constexpr int64_t gated_gate_column(int64_t j, int64_t f) {
  const int64_t whole = f - f % kSwigluBlock;
  return j < whole ? j / kSwigluBlock * 2 * kSwigluBlock + j % kSwigluBlock : 2 * whole + (j - whole);
}
inline constexpr int64_t gated_block_width(int64_t j, int64_t f) {
  return j < f - f % kSwigluBlock ? kSwigluBlock : f % kSwigluBlock;
}
void swiglu(const TensorView& input, const TensorView& out, cudaStream_t stream);
void swiglu_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                     cudaStream_t stream);
// swiglu_backward that also writes the forward's output = swiglu(input) ([..., N / 2], like
// grad_output), from the same read of input: for a backward that recomputes the activation
// instead of keeping it (tessera::mlp's).
void swiglu_backward_recompute(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                               const TensorView& output, cudaStream_t stream);
// GeGLU's gate in the same layout (matmul's activation 'geglu'): gelu_tanh(gate) * up.
void geglu_blocks(const TensorView& input, const TensorView& out, cudaStream_t stream);
void geglu_blocks_backward(const TensorView& grad_output, const TensorView& input, const TensorView& grad_input,
                           cudaStream_t stream);
void geglu_blocks_backward_recompute(const TensorView& grad_output, const TensorView& input,
                                     const TensorView& grad_input, const TensorView& output, cudaStream_t stream);

// dst = src: any strides on either side (a transpose, a gather of a strided view), same shape and
// dtype. dst must not overlap src unless it is the same view (then nothing is done).
void copy(const TensorView& src, const TensorView& dst, cudaStream_t stream);

// ---- dropout ----------------------------------------------------------------------------------
// Inverted dropout on a counter-based generator (Philox4x32-10): element i of input (its row-major
// index, whatever the strides) is kept when the uniform number drawn for counter (offset + i / 4,
// lane i % 4) under key `seed` is >= p, and kept elements are scaled by 1 / (1 - p). The mask is
// never stored: dropout_backward regenerates it from (seed, offset), so the same (seed, offset)
// gives bit-identical results on every run. p = 0 copies input; p = 1 writes zeros. 0 <= p <= 1.
// out has input's shape and dtype and may be input itself.
void dropout(const TensorView& input, const TensorView& out, double p, uint64_t seed,
             uint64_t offset, cudaStream_t stream);
// out = grad_output * mask(seed, offset) / (1 - p), with the forward's p, seed and offset.
void dropout_backward(const TensorView& grad_output, const TensorView& out, double p,
                      uint64_t seed, uint64_t offset, cudaStream_t stream);
// Philox counters one call over `numel` elements consumes: ceil(numel / 4). A caller that keeps a
// running offset adds this after each call so that no two calls share random numbers.
uint64_t dropout_offset_increment(int64_t numel);

}  // namespace tessera
