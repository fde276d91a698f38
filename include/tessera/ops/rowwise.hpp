// Row-wise operators: softmax and log-softmax over one dimension, LayerNorm and RMSNorm over the
// trailing dimensions (also fused with a residual add), each with its backward. Every function
// checks its arguments (throwing tessera::Error before any launch), returns at once for
// 0-element tensors (except that a norm backward over 0 rows writes zeros to
// grad_weight/grad_bias, the sum over no rows, as torch does), and enqueues its kernels on
// `stream`.
//
// Supported dtypes: float32, float16, bfloat16; all arithmetic in float32. Inputs and outputs may
// have any strides; the fast kernels want the reduced dimension(s) dense (stride 1), other layouts
// take a strided path (softmax) or are gathered to contiguous scratch memory first (norms).
// Outputs must not overlap inputs, except where a function says so.
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/ops/matrix.hpp"
#include "tessera/tensor.hpp"

namespace tessera {

// ---- softmax ----------------------------------------------------------------------------------
// out = softmax(input) along `dim` (negative counts from the end; a 0-d input is treated as [1]),
// as torch.softmax: NaN in a row gives NaN for that row, a row of all -inf gives NaN. out has
// input's shape and dtype; it may be input itself (same view) for in-place use.
void softmax(const TensorView& input, int dim, const TensorView& out, cudaStream_t stream);
// out = log_softmax(input) along `dim`, as torch.log_softmax.
void log_softmax(const TensorView& input, int dim, const TensorView& out, cudaStream_t stream);

// out = output * (grad_output - sum_dim(grad_output * output)), where output = softmax(input) is
// the forward's output.
void softmax_backward(const TensorView& grad_output, const TensorView& output, int dim,
                      const TensorView& out, cudaStream_t stream);
// out = grad_output - exp(output) * sum_dim(grad_output), where output = log_softmax(input).
void log_softmax_backward(const TensorView& grad_output, const TensorView& output, int dim,
                          const TensorView& out, cudaStream_t stream);

// ---- LayerNorm and RMSNorm ----------------------------------------------------------------------
// The last `normalized_ndim` dimensions of input (1 <= normalized_ndim <= input.ndim) are
// normalized together: input is viewed as rows (the leading dimensions) of N = prod(normalized
// shape) elements. weight and bias, where given (nullptr: none), have exactly the normalized shape
// and input's dtype. mean and rstd are float32 tensors of the leading shape
// (input.shape[:-normalized_ndim]; 0-d when every dimension is normalized); they may be nullptr
// when the caller does not need them. Rows of no elements (N = 0) get NaN statistics, as torch's.

// out = (input - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps) (biased variance), as
// torch.nn.functional.layer_norm.
void layer_norm(const TensorView& input, int normalized_ndim, const TensorView* weight,
                const TensorView* bias, double eps, const TensorView& out, const TensorView* mean,
                const TensorView* rstd, cudaStream_t stream);

// Gradients of layer_norm, given the forward's saved mean and rstd (of the leading shape, or of
// torch's leading + (1,) * normalized_ndim, as the backwards below take them). grad_input has input's shape;
// grad_weight and grad_bias (each nullptr when not wanted; grad_weight needs weight) have the
// normalized shape. grad_weight and grad_bias are reduced over rows in a fixed order: the same
// inputs on the same GPU give bit-identical results on every run.
void layer_norm_backward(const TensorView& grad_output, const TensorView& input,
                         int normalized_ndim, const TensorView& mean, const TensorView& rstd,
                         const TensorView* weight, const TensorView* grad_input,
                         const TensorView* grad_weight, const TensorView* grad_bias,
                         cudaStream_t stream);

// out = input * rstd * (weight + weight_offset), rstd = 1 / sqrt(mean(input^2) + eps), as
// torch.nn.functional.rms_norm when weight_offset is 0. The offset is added to each weight in
// float32 (Gemma's x * (1 + weight), computed in float32 and rounded once); it needs a weight.
// (torch's default eps, finfo(dtype).eps, is the Python layer's business: here eps is explicit.)
void rms_norm(const TensorView& input, int normalized_ndim, const TensorView* weight, double eps,
              double weight_offset, const TensorView& out, const TensorView* rstd, cudaStream_t stream);

// Gradients of rms_norm with the forward's weight and weight_offset. grad_weight is that of
// weight (the offset's derivative is 1).
void rms_norm_backward(const TensorView& grad_output, const TensorView& input,
                       int normalized_ndim, const TensorView& rstd, const TensorView* weight,
                       double weight_offset, const TensorView* grad_input,
                       const TensorView* grad_weight, cudaStream_t stream);

// ---- residual add fused with LayerNorm and RMSNorm ------------------------------------------------
// residual_out = input + residual (rounded to input's dtype, as torch's input + residual is), then
// out = the norm of residual_out over its last dimension, in one pass: input and residual are read
// once, out and residual_out written once (vLLM's fused_add_rms_norm, Apex's fused add + norm).
// input, residual, out and residual_out have one shape (at least 1-d) and dtype; weight and bias
// (nullptr: none) the last dimension's size; mean and rstd (float32, input.shape[:-1]; nullptr:
// not wanted) are residual_out's. out may be input itself and residual_out residual itself (the
// same views: the update in place of vLLM's op); no other output may overlap an input.
void add_layer_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                    const TensorView* bias, double eps, const TensorView& out,
                    const TensorView& residual_out, const TensorView* mean, const TensorView* rstd,
                    cudaStream_t stream);
void add_rms_norm(const TensorView& input, const TensorView& residual, const TensorView* weight,
                  double eps, const TensorView& out, const TensorView& residual_out,
                  const TensorView* rstd, cudaStream_t stream);

// Their gradients, in one pass over grad_output, grad_residual_out and the forward's residual_out
// and statistics: grad_input = the norm's gradient + grad_residual_out, which is the gradient of
// both input and residual; grad_weight and grad_bias as in layer_norm_backward (deterministic).
// Either gradient may be nullptr (zero): without grad_output, grad_input is grad_residual_out and
// no pass runs. grad_input may be grad_residual_out itself (the same view).
void add_layer_norm_backward(const TensorView* grad_output, const TensorView* grad_residual_out,
                             const TensorView& residual_out, const TensorView& mean,
                             const TensorView& rstd, const TensorView* weight,
                             const TensorView* grad_input, const TensorView* grad_weight,
                             const TensorView* grad_bias, cudaStream_t stream);
void add_rms_norm_backward(const TensorView* grad_output, const TensorView* grad_residual_out,
                           const TensorView& residual_out, const TensorView& rstd,
                           const TensorView* weight, const TensorView* grad_input,
                           const TensorView* grad_weight, cudaStream_t stream);

// ---- RMSNorm with float8 outputs ------------------------------------------------------------------
// rms_norm over the last dimension (with a residual: add_rms_norm, residual_out = input +
// residual, then the norm of that) whose output is also quantized for a float8 GEMM as
// float8_quantize quantizes out viewed as [M, K] (K the last dimension, M the product of the
// others; out contiguous): q [M, K] float8_e4m3fn with scale ('row': [M, 1]; 'tensor': one
// element) and, where q_t is given, out's columns quantized along M into q_t [K, M] with scale_t
// ([1, K] or one element). The same bits as the norm and then float8_quantize. The norm's kernel
// takes out's maxima as it writes out, so that the quantization reads out once instead of twice
// (16-bit rows, 16-byte aligned, on the rms_norm tiers that loop over rows: up to 8192 elements
// with a residual, fewer than 8192 without one on sm_90; others run as the two ops). residual and
// residual_out both or neither; weight, weight_offset and rstd as rms_norm's.
struct NormFloat8 {
  const TensorView& q;
  const TensorView& scale;
  const TensorView* q_t = nullptr;
  const TensorView* scale_t = nullptr;
  Float8Granularity granularity = Float8Granularity::row;
};
void rms_norm_float8(const TensorView& input, const TensorView* residual, const TensorView* weight, double eps,
                     double weight_offset, const TensorView& out, const TensorView* residual_out,
                     const TensorView* rstd, const NormFloat8& float8, cudaStream_t stream);

}  // namespace tessera
