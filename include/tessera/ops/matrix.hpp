// Matrix operators: matmul (GEMM) with a fused epilogue, and the two-layer MLP on it. Checks
// arguments before any launch (tessera::Error names the argument), returns at once when there is
// nothing to do, and enqueues its kernels on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <string_view>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera {

// swiglu and geglu: gated activations over column pairs, out = silu(gate) * up (SwiGLU) or
// gelu_tanh(gate) * up (GeGLU, Gemma's), with gate and up the product's columns interleaved in
// blocks of 64 features (the layout of tessera::swiglu in tessera/ops/elementwise.hpp): out has
// N / 2 columns, N even, no residual or beta. On sm_90 (16-bit output, input and other
// K-contiguous, N a multiple of 128) they run in the GEMM's epilogue, which writes only out (and
// the pre-activation where asked for); elsewhere the product goes to the pre-activation output (or
// scratch) and tessera::swiglu or tessera::geglu_blocks makes out from it.
enum class Activation { none, relu, gelu, gelu_tanh, silu, swiglu, geglu };
inline constexpr Activation kActivations[] = {Activation::none,      Activation::relu, Activation::gelu,
                                              Activation::gelu_tanh, Activation::silu, Activation::swiglu,
                                              Activation::geglu};
// "none", "relu", "gelu", "gelu_tanh", "silu", "swiglu", "geglu"
const char* activation_name(Activation a);
// swiglu and geglu: the output has half the product's columns.
inline constexpr bool is_gated(Activation a) { return a == Activation::swiglu || a == Activation::geglu; }

// What matmul does besides the product, applied in its epilogue (no extra pass over memory):
//   out = activation(alpha * (input @ other) + bias) + residual + beta * out
// bias (nullptr: none) is a vector of N elements (any stride); residual (nullptr: none) has out's
// shape (any strides, batch dimension of size 1 broadcast); both have out's dtype. beta = 0 does
// not read out (NaN there does not propagate), as BLAS does.
struct MatmulOptions {
  const TensorView* bias = nullptr;
  const TensorView* residual = nullptr;
  Activation activation = Activation::none;
  double alpha = 1.0;
  // Optional: a float32 tensor of one element, read on the device, multiplying alpha (a factor
  // known only on the GPU, such as 1 / the count of a mean, without a synchronization).
  const TensorView* scale = nullptr;
  double beta = 0.0;
  // float32 inputs: multiply on the tensor cores in TF32 (10-bit mantissa) where true, as
  // torch.backends.cuda.matmul.allow_tf32; exact float32 arithmetic where false.
  bool allow_tf32 = false;
  // Optional: a second output, of out's shape and dtype, receiving alpha * (input @ other) + bias
  // before the activation, residual and beta: what the activation's backward reads, stored by
  // the same kernel. It must not overlap out, the inputs or the residual. With swiglu it has the
  // product's N columns (twice out's).
  const TensorView* preactivation = nullptr;
};

// out[b] = input[b] @ other[b] (+ the epilogue of `options`), in float32 accumulation.
// input is [M, K] or [B, M, K], other [K, N] or [B, K, N], out [M, N] or [B, M, N]; a 2-d operand
// is shared by every batch. Any strides: row- or column-major operands (and transposed views) take
// the fast kernels without a copy; other layouts a slower one. input and other share one dtype
// (float32, float16, bfloat16); out has that dtype or float32 and must not overlap the inputs.
// K = 0 gives the epilogue applied to zeros.
void matmul(const TensorView& input, const TensorView& other, const TensorView& out,
            const MatmulOptions& options, cudaStream_t stream);

// What mlp does besides its two products.
struct MlpOptions {
  Activation activation = Activation::swiglu;
  // float32 inputs: TF32 tensor cores for both products where true (MatmulOptions::allow_tf32).
  bool allow_tf32 = false;
  // Optional: the first product before the activation, [..., M, N] in input's dtype, stored by the
  // first GEMM's kernel (MatmulOptions::preactivation): what a backward reads to recompute the
  // hidden activation instead of keeping it.
  const TensorView* preactivation = nullptr;
  // Where the hidden activation goes between the two products: contiguous, input's dtype, at least
  // [..., M, N'] elements; nullptr: tessera's scratch pool.
  const TensorView* hidden = nullptr;
};

// A two-layer MLP without biases, the layout of two nn.Linear weights:
//   out = activation(input @ w_in^T) @ w_out^T
// input [M, K] or [B, M, K]; w_in [N, K]; w_out [D, N'], N' = N / 2 for swiglu and geglu (w_in's
// rows gate and up interleaved in blocks of 64 features, N even), else N; out [M, D] or [B, M, D]. One
// dtype for all (float32, float16, bfloat16); the hidden activation [.., M, N'] is rounded to it,
// as two matmul calls would round it. Two matmul calls: the first with the activation (and the
// preactivation) in its epilogue.
void mlp(const TensorView& input, const TensorView& w_in, const TensorView& w_out, const TensorView& out,
         const MlpOptions& options, cudaStream_t stream);

// out = scale_a * scale_b * (input @ other) + bias, as torch._scaled_mm with per-tensor scales:
// input [M, K] and other [K, N] of one float8 dtype (float8_e4m3fn or float8_e5m2); scale_a and
// scale_b float32 tensors of one element, read on the device; out [M, N] bfloat16, float16 or
// float32; bias (nullptr: none) N elements of out's dtype. Or row-wise scales, scale_a [M, 1] and
// scale_b [1, N], contiguous; or block-wise (float8_e4m3fn), scale_a [M, ceil(K / 128)] (one per
// 1 x 128 block of input's rows) and scale_b [ceil(K / 128), ceil(N / 128)] (one per 128 x 128
// block of other), any strides, each 128-deep block of K's sums scaled and added in float32.
// Float32 accumulation. input row-major
// and other column-major (K contiguous in both: torch's layout) take the tensor cores on sm_90;
// other layouts and GPUs a slower kernel.
void scaled_mm(const TensorView& input, const TensorView& other, const TensorView& scale_a,
               const TensorView& scale_b, const TensorView& out, const TensorView* bias,
               cudaStream_t stream);

// scaled_mm's epilogue beyond the scales, matmul's (MatmulOptions) on the scaled product: out =
// activation(scale_a * scale_b * (input @ other) + bias) + residual + beta * out, out's old values
// read where beta is not 0 (a product accumulated into out over calls, as a gradient over chunks
// of K). Per-tensor and row-wise scales take beta; block-wise ones refuse it. Activations swiglu
// and geglu pair the product's columns as matmul's do (out has N / 2 columns; no residual or
// beta with them); preactivation (out's shape, or with swiglu / geglu the product's N columns)
// receives the scaled product plus bias before the activation.
struct ScaledMmOptions {
  const TensorView* bias = nullptr;
  double beta = 0.0;
  const TensorView* residual = nullptr;
  Activation activation = Activation::none;
  const TensorView* preactivation = nullptr;
};
void scaled_mm(const TensorView& input, const TensorView& other, const TensorView& scale_a,
               const TensorView& scale_b, const TensorView& out, const ScaledMmOptions& options,
               cudaStream_t stream);

// torch._grouped_mm: a product per group in one call, float32 accumulation, the groups' offsets
// (offs: int32 [G], contiguous, the groups' cumulative ends, on input's device) never read on the
// host. The forms:
//   input [M, K]    @ other [G, K, N], offs over M  -> out [M, N]:    rows of group g times other[g]
//   input [G, M, K] @ other [K, N],    offs over N  -> out [M, N]:    input[g] times columns of group g
//   input [M, K]    @ other [K, N],    offs over K  -> out [G, M, N]: out[g] over group g's K
//   input [G, M, K] @ other [G, K, N], offs nullptr -> out [G, M, N]
// Group g spans [offs[g - 1], offs[g]) (offs[-1] = 0); rows (columns) past offs[G - 1] are zero, as
// is out[g] of an empty K range. An end below the one before it makes its group empty, one past
// the extent stops there: bad offsets are never read out of bounds. input and other share a
// dtype (float32, float16, bfloat16); out has it or float32 and overlaps neither. Any strides; 16-bit
// operands that TMA can address take the sm90 tier's persistent kernel in the rows form.
void grouped_mm(const TensorView& input, const TensorView& other, const TensorView* offs, const TensorView& out,
                cudaStream_t stream);

// float8_quantize: x [M, K] (float32, float16 or bfloat16, K contiguous) to float8_e4m3fn for
// scaled_mm, in one call (tessera.float8.quantize's numerics, bit for bit, which are torchao's):
// a group's multiplier m = 448 * (1 / max(amax, 1e-12)) in float64, rounded to float32;
// q = x * m in float32 rounded to nearest even e4m3, saturated at +-448; the scale the
// dequantization factor 1 / m in float32 (x ~ q * scale). A group holding inf or NaN takes m and
// the scale NaN (its bytes NaN).
//   granularity row:    q [M, K] contiguous, scale [M, 1] float32 (one per row of x);
//   granularity tensor: q [M, K], scale of one element (0-d or [1]);
//   granularity block:  q [M, K], scale [M, ceil(K / 128)] (one per 1 x 128 block of a row, a last
//                       block of fewer than 128 its own);
//   granularity block2d: q [M, K], scale [M / 128, K / 128] (one per 128 x 128 block; M and K
//                       multiples of 128).
// Where q_t and scale_t are given (both or neither), also x's columns quantized along M:
//   q_t [K, M] contiguous (x transposed, row k holding column k of x), and scale_t [1, K], one
//   per column of x (row), or one element, the same as scale (tensor), or [ceil(M / 128), K], one
//   per 128 x 1 block of a column (block), or [M / 128, K / 128], the same as scale (block2d: a
//   block's transpose is a block). The per-row and per-tensor scale shapes are
//   scaled_mm's: q with scale as its left operand (scale_a [M, 1]); q_t.t() as its right one
//   ([M, K] column-major, K the product's N) with scale_t as scale_b [1, K]; q_t as a left
//   operand (x's columns as rows, M the product's K) with scale_t.t() ([K, 1]) as scale_a; the
//   block ones are scaled_mm's block-wise scales likewise (block: q_t.t() with scale_t as
//   per-column scale_b, q_t with scale_t.t() as scale_a; block2d, x a weight: q.t() with scale.t()
//   and q_t.t() with scale_t as scale_b, 128 x 128 blocks).
//   The transposed outputs need M and K multiples of 16 (M is the depth of the product q_t
//   feeds, and the fp8 tensor cores step K by 16; K likewise for q, which feeds the other one).
enum class Float8Granularity { tensor, row, block, block2d };
// "tensor", "row", "block", "block2d"
void parse(const char* op, std::string_view name, Float8Granularity& out);
void float8_quantize(const TensorView& input, const TensorView& q, const TensorView& scale, const TensorView* q_t,
                     const TensorView* scale_t, Float8Granularity granularity, cudaStream_t stream);
// x's columns alone: q_t and scale_t as float8_quantize writes them, without q and scale (a
// weight's copy for dgrad, whose rows were quantized for the forward): the rows' quotients and
// stores skipped.
void float8_quantize_transposed(const TensorView& input, const TensorView& q_t, const TensorView& scale_t,
                                Float8Granularity granularity, cudaStream_t stream);
// A gated feed-forward's product quantized as float8_quantize quantizes x, without a separate
// pass: x = act(gate) * up (activation silu: SwiGLU's, silu_mul's; gelu_tanh: GeGLU's, geglu's),
// rounded to gate's dtype as those ops round their output, so that the outputs are
// float8_quantize's of their output bit for bit. gate and up: one shape [M, K] and float dtype, K
// contiguous. The product's maxima come from the pass that computes it; per row and per tensor,
// that pass also leaves it in scratch memory for the quotients' pass (M K elements of gate's
// dtype, freed on `stream`), the block granularities need no second pass.
void float8_quantize_gated(const TensorView& gate, const TensorView& up, Activation activation, const TensorView& q,
                           const TensorView& scale, const TensorView* q_t, const TensorView* scale_t,
                           Float8Granularity granularity, cudaStream_t stream);
// A tensor's float8 copies as float8_quantize writes them: q and scale, and where q_t is given its
// columns quantized along M (q_t, scale_t).
struct Float8Copy {
  const TensorView& q;
  const TensorView& scale;
  const TensorView* q_t = nullptr;
  const TensorView* scale_t = nullptr;
};
// The gated product's backward with both gradients quantized as they are written, for the float8
// GEMMs of the gate and up projections: grad_gate = grad_output * up * act'(gate) and grad_up =
// grad_output * act(gate) (activation 'silu' or 'gelu_tanh': silu_mul_backward's and
// geglu_backward's bits) into grad_gate and grad_up (contiguous [M, K]), and each quantized as
// float8_quantize quantizes it (granularity 'row' or 'tensor') into its Float8Copy, from one read
// of grad_output, gate and up: the first pass computes and stores the gradients and takes both
// one's maxima, the second quantizes each. grad_output, gate and up: [M, K], K contiguous, one
// row stride.
void float8_quantize_gated_backward(const TensorView& grad_output, const TensorView& gate, const TensorView& up,
                                    Activation activation, const TensorView& grad_gate, const TensorView& grad_up,
                                    const Float8Copy& gate_copy, const Float8Copy& up_copy,
                                    Float8Granularity granularity, cudaStream_t stream);
// float8_quantize's scale and scale_t shapes for x [M, K] (empty: one element, 0-d as allocated).
struct Float8ScaleShapes {
  std::vector<int64_t> scale, scale_t;
};
Float8ScaleShapes float8_scale_shapes(int64_t m, int64_t k, Float8Granularity granularity);

}  // namespace tessera
