// Losses: cross-entropy over class scores, with torch's semantics for the arguments it shares with
// torch.nn.functional.cross_entropy, and the Jensen-Shannon divergence of distillation. Checks
// arguments before any launch (tessera::Error names the argument) and enqueues its kernels on
// `stream`.
#pragma once

#include <string_view>

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/tensor.hpp"

namespace tessera {

enum class Reduction { none, mean, sum };
// "none", "mean", "sum"; anything else is refused, naming op's argument 'reduction'.
void parse(const char* op, std::string_view name, Reduction& out);

struct CrossEntropyOptions {
  int64_t ignore_index = -100;   // rows with this target add nothing (loss 0, gradient 0)
  Reduction reduction = Reduction::mean;  // mean: over the rows not ignored (none left: NaN, as torch)
  double label_smoothing = 0.0;  // in [0, 1]: the target is (1 - e) one-hot + e / V uniform
  double z_loss = 0.0;           // >= 0: adds z_loss * lse^2 per row (PaLM's z-loss)
  double softcap = 0.0;          // > 0: logits become softcap * tanh(logits / softcap) first
  // Class weights (torch's `weight`): float32 [V], contiguous, on the logits' device; nullptr: all 1.
  // Not read by linear_cross_entropy, which refuses it.
  const TensorView* weight = nullptr;
};

// The cross-entropy of each row of logits [N, V] (float32, float16, bfloat16; the class dimension
// contiguous, rows any stride) against target, in one pass over the logits that also writes the
// gradient. As torch's F.cross_entropy, target is either
//   class indices: [N], int64 or int32 (contiguous); with e the label smoothing, w the weights,
//     loss_i = (1 - e) w_t (lse_i - y_{i,t}) + (e / V) sum_j w_j (lse_i - y_{i,j}),
//     rows whose target is ignore_index adding 0, and the mean dividing by the sum of w_t over
//     the rows not ignored (their count without weights); or
//   class probabilities q: the logits' shape [N, V] and dtype (contiguous classes, rows any
//     stride), with q' = (1 - e) q + e / V,
//     loss_i = sum_j w_j q'_{i,j} (lse_i - y_{i,j}),
//     the mean dividing by N; ignore_index must then be negative (torch's rule), and ignores none;
// y = the (capped) logits, lse_i = log sum_j exp(y_{i,j}). The z-loss adds z lse_i^2 times the
// weight the row puts on lse_i (1 without class weights, for probabilities that sum to 1).
//   loss: float32, [] for mean and sum, [N] for none (ignored rows 0);
//   lse (optional, nullptr: not written): float32 [N];
//   grad (optional): d loss / d logits for a loss gradient of 1, [N, V] in the logits' dtype
//     (contiguous classes); it may be logits itself (the same view), so that training needs no
//     second N x V buffer. Ignored rows get 0.
// A class index outside [0, V) that is not ignore_index makes its row's loss and gradient NaN
// (checked on the device: no synchronization). Math in float32.
void cross_entropy(const TensorView& logits, const TensorView& target, const TensorView& loss,
                   const TensorView* lse, const TensorView* grad, const CrossEntropyOptions& options,
                   cudaStream_t stream);

// The backward: grad (cross_entropy's gradient, for a loss gradient of 1) scaled in place by
// grad_loss, float32: [] for mean and sum, [N] (any stride) for none. Rows whose factor is exactly
// 1 are left as they are, so training's backward (a loss gradient of 1) costs no pass over grad.
void cross_entropy_backward(const TensorView& grad_loss, const TensorView& grad, Reduction reduction,
                            cudaStream_t stream);

// Fused linear cross-entropy (FLCE): cross_entropy(hidden @ weight^T + bias, target) and its
// gradients without the [N, V] logits, for a language model's output projection and loss. The
// options are cross_entropy's; class weights (options.weight, V float32) as torch's, the mean over
// the sum of the rows' target weights; with z_loss, cross_entropy's convention (the z-term
// weighted as the row's lse).
struct LinearCrossEntropyOptions : CrossEntropyOptions {
  // Where a chunk's logits and then their gradient go: contiguous, of hidden's dtype, at least V
  // elements (the chunk is as many token rows as it holds, up to chunk_rows); nullptr: tessera's
  // scratch pool, chunk_rows rows (0: as many as fit in 512 MiB or a quarter of the free memory,
  // whichever is less, a multiple of 256).
  const TensorView* workspace = nullptr;
  int64_t chunk_rows = 0;
  // Optional output, float32 []: the token accuracy that TRL's SFTTrainer logs (Liger's
  // return_token_accuracy), the fraction of the rows not ignored whose logits' argmax (the first
  // where several tie) is the target; NaN where every row is ignored. A read of each chunk's
  // logits more.
  const TensorView* accuracy = nullptr;
  // Optional output, target's dtype and shape [N]: each row's predicted token (Liger's
  // return_predicted_tokens), its logits' argmax (the first where several tie), -1 where the row
  // is ignored. From the same pass as the accuracy.
  const TensorView* predicted = nullptr;
};

// The gradients wanted (each nullptr: not computed), for the loss gradient grad_loss (float32, []
// for mean and sum, [N] for none; nullptr: 1).
struct LinearCrossEntropyGrads {
  const TensorView* d_hidden = nullptr;  // [N, H], hidden's dtype
  // [V, H], weight's dtype, or float32 for a 16-bit weight: the chunks' parts then add up in
  // float32 (Liger's accum_dtype), at twice the bytes. Overwritten, not added to.
  const TensorView* d_weight = nullptr;
  const TensorView* d_bias = nullptr;    // [V], bias's dtype
  const TensorView* grad_loss = nullptr;
};

// hidden [N, H] and weight [V, H] of one dtype (bfloat16, float16; float32 in exact float32), bias
// [V] or nullptr, target [N] int64 or int32; loss and lse as cross_entropy's (lse optional). The
// tokens go in chunks: each chunk's logits by tessera::matmul into the workspace, their loss and
// gradient in place (cross_entropy), then that chunk's part of d_hidden and d_weight by two more
// GEMMs, the mean's 1 / count and grad_loss folded into the GEMMs' scale (read on the device). The
// extra memory is one chunk of logits. Options and semantics are cross_entropy's.
void linear_cross_entropy(const TensorView& hidden, const TensorView& weight, const TensorView* bias,
                          const TensorView& target, const TensorView& loss, const TensorView* lse,
                          const LinearCrossEntropyGrads& grads, const LinearCrossEntropyOptions& options,
                          cudaStream_t stream);

// The generalized Jensen-Shannon divergence of each row of a student's logits from a teacher's
// (knowledge distillation; Liger-Kernel's LigerJSD), with its gradient with respect to the student's
// logits in the same kernel. With T the temperature, Q = softmax(student / T), P =
// softmax(teacher / T) and M = beta P + (1 - beta) Q:
//   beta = 0:  loss_i = KL(P || Q) = sum_j P_j (log P_j - log Q_j)  (forward KL);
//   beta = 1:  loss_i = KL(Q || P)                                   (reverse KL);
//   otherwise: loss_i = beta KL(P || M) + (1 - beta) KL(Q || M).
// A class whose weight in a sum is 0 adds 0 there (0 log 0 = 0: a masked class, logit -inf).
struct JsdOptions {
  double beta = 0.5;           // in [0, 1]
  double temperature = 1.0;    // > 0: both rows of logits are divided by it
  int64_t ignore_index = -100; // rows whose target is this: loss 0, gradient 0
};

// student and teacher [N, V] of one shape and dtype (float32, float16, bfloat16; the class
// dimension contiguous, rows any stride), on one device; math in float32.
//   target (optional, nullptr: no row ignored): int64 [N], contiguous; read only against ignore_index;
//   loss: float32 [N], contiguous, each row's loss (no reduction: the caller reduces);
//   grad (optional, nullptr: not written): d loss_i / d student for a loss gradient of 1 per row,
//     student's shape and dtype (contiguous classes); it may be student itself (the same view), so
//     that distillation needs no second N x V buffer; it must not overlap teacher. Ignored rows
//     get 0. cross_entropy_backward(grad_loss, grad, Reduction::none) scales it by each row's
//     loss gradient afterwards.
void jsd(const TensorView& student, const TensorView& teacher, const TensorView* target, const TensorView& loss,
         const TensorView* grad, const JsdOptions& options, cudaStream_t stream);

}  // namespace tessera
