// The Mixture-of-Experts family: a layer's (token, expert) pairs moved into expert order and back.
// `rows` [T, k] int32 (contiguous) gives each pair's row in expert order: token t's j-th expert's
// row is rows[t, j], a permutation of [0, T k). A row outside [0, T k) drops its pair (written
// nowhere, read as zero). `weight` [T, k] (nullptr: all ones) is the routing weight of each pair,
// float32, float16 or bfloat16, read in float32. Tokens [T, H] and pairs [T k, H] share a dtype
// (float32, float16, bfloat16), their last dimension contiguous, any row stride; sums in float32
// in the order j = 0 .. k - 1, so results are the same bits on every run.
#pragma once

#include <cuda_runtime_api.h>

#include "tessera/tensor.hpp"

namespace tessera {

// out[rows[t, j]] = weight[t, j] * input[t]: input [T, H] (tokens), out [T k, H] (pairs).
void moe_permute(const TensorView& input, const TensorView& rows, const TensorView* weight, const TensorView& out,
                 cudaStream_t stream);

// out[t] = sum_j weight[t, j] * input[rows[t, j]]: input [T k, H] (pairs), out [T, H] (tokens).
void moe_unpermute(const TensorView& input, const TensorView& rows, const TensorView* weight, const TensorView& out,
                   cudaStream_t stream);

// moe_permute's gradients from grad_output [T k, H]: grad_input [T, H] = moe_unpermute(grad_output,
// rows, weight) and, where grad_weight is given, grad_weight[t, j] = <grad_output[rows[t, j]],
// input[t]> (weight's dtype and shape). One pass over grad_output.
void moe_permute_backward(const TensorView& grad_output, const TensorView& input, const TensorView& rows,
                          const TensorView* weight, const TensorView& grad_input, const TensorView* grad_weight,
                          cudaStream_t stream);

// moe_unpermute's gradients from grad_output [T, H]: grad_input [T k, H] = moe_permute(grad_output,
// rows, weight) and, where grad_weight is given, grad_weight[t, j] = <input[rows[t, j]],
// grad_output[t]>. One pass over input's rows.
void moe_unpermute_backward(const TensorView& grad_output, const TensorView& input, const TensorView& rows,
                            const TensorView* weight, const TensorView& grad_input, const TensorView* grad_weight,
                            cudaStream_t stream);

}  // namespace tessera
