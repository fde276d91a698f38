// CPU references for attention, forward and backward, in double precision: the naive
// softmax(scale * Q K^T, masked) V that the GPU kernels are checked against.
//
// Layout is FlashAttention's: q [batch, seq_q, heads_q, head_dim], k [batch, seq_k, heads_kv,
// head_dim], v [batch, seq_k, heads_kv, head_dim_v] (host views, any strides; torch's SDPA layout
// [batch, heads, seq, dim] is the same data through a transposed view). heads_q is a multiple of
// heads_kv: query head h reads key/value head h / (heads_q / heads_kv) (GQA; MQA at heads_kv 1).
// Packed sequences (varlen): q [total_q, heads_q, head_dim], k and v [total_k, heads_kv, ...] and
// cu_seqlens (batch + 1 offsets, starting at 0, non-decreasing) per side.
//
// Masks, as FlashAttention: query i of a sequence sees key j where j <= i + (len_k - len_q)
// under `causal` (the diagonal aligned to the bottom right when the lengths differ), and where
// i + (len_k - len_q) - window_left <= j <= i + (len_k - len_q) + window_right for a sliding
// window (a negative bound is unbounded, and so is one at or beyond the longest key sequence,
// FlashAttention's max_seqlen_k). Scores are scale * q.k, then softcap * tanh(s / softcap) where
// softcap > 0, then plus ALiBi's bias -slope |i + (len_k - len_q) - j| where slopes are given (it
// enters lse too, and has no gradient). A query that sees no key gets output 0 and log-sum-exp
// +inf (no NaN), so the backward's exp(s - lse) is 0 there too.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/tensor.hpp"

namespace tessera::reference {

struct AttentionSpec {
  double scale = 0.0;         // 0: 1 / sqrt(head_dim)
  bool causal = false;
  int64_t window_left = -1;   // keys before the (shifted) diagonal a query sees; -1: all
  int64_t window_right = -1;  // keys after it; -1: all (causal caps it at 0)
  double softcap = 0.0;       // 0: none
  // ALiBi's slopes: heads_q of them (every sequence's), or batch * heads_q (sequence b's at b *
  // heads_q + h); empty: none.
  std::vector<double> alibi_slopes;
};

// out [batch, seq_q, heads_q, head_dim_v] (or [total_q, heads_q, head_dim_v]) and lse [batch,
// heads_q, seq_q] (or [heads_q, total_q]), row-major.
struct AttentionOutput {
  std::vector<double> out;
  std::vector<double> lse;
};

// dq, dk, dv with the shapes of q, k, v, row-major.
struct AttentionGrads {
  std::vector<double> dq, dk, dv;
};

AttentionOutput attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const AttentionSpec& spec);
AttentionGrads attention_backward(const TensorView& grad_out, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  const AttentionSpec& spec);

AttentionOutput attention_varlen_forward(const TensorView& q, const TensorView& k,
                                         const TensorView& v, const std::vector<int64_t>& cu_seqlens_q,
                                         const std::vector<int64_t>& cu_seqlens_k,
                                         const AttentionSpec& spec);
AttentionGrads attention_varlen_backward(const TensorView& grad_out, const TensorView& q,
                                         const TensorView& k, const TensorView& v,
                                         const std::vector<int64_t>& cu_seqlens_q,
                                         const std::vector<int64_t>& cu_seqlens_k,
                                         const AttentionSpec& spec);

}  // namespace tessera::reference
