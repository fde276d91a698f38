// Attention: out = softmax(scale * Q K^T, masked) V, in FlashAttention's layout. Checks arguments
// before any launch (tessera::Error names the argument), returns at once when there is nothing to
// do, and enqueues its kernel on `stream`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string_view>

#include "tessera/tensor.hpp"

namespace tessera {

// Which kernel runs a call: the fastest that takes it, or one named (to check and measure the
// kernels against each other; naming one that cannot take the call is an error).
//   generic  any GPU, dtype, strides and head dimension up to 256
//   sm90     Hopper (sm_90a build): bfloat16/float16, head_dim = head_dim_v in {64, 128, 256}, the
//            head dimension contiguous, other strides multiples of 16 bytes, 16-byte aligned data
//   decode   a few queries (seq_q <= 16) against many keys, split over the keys and merged
//            (flash-decoding); bfloat16/float16, head_dim as sm90's, 16-byte aligned rows
enum class AttentionTier { automatic, generic, sm90, decode };

// Query i of a sequence of seq_q queries and seq_k keys sits on the diagonal at key i + seq_k - seq_q
// (bottom-right alignment, as FlashAttention's). A window side (left or right) below 0, or at or
// beyond seq_k, is unbounded there, as in FlashAttention: seq_k is the keys' length, the longest
// sequence's (max_seqlen_k) for packed sequences, the cache's capacity for a KV cache.
struct AttentionOptions {
  double scale = 0.0;         // 0: 1 / sqrt(head_dim)
  bool causal = false;        // the diagonal aligned to the bottom right when seq_q != seq_k
  int64_t window_left = -1;   // sliding window: keys before the diagonal a query sees (-1: all)
  int64_t window_right = -1;  // keys after it (-1: all; causal caps it at 0)
  double softcap = 0.0;       // scores become softcap * tanh(score / softcap) where > 0
  bool deterministic = false; // backward: dq summed in a fixed order, the same bits every run
  // ALiBi, as flash_attn_func's alibi_slopes: float32 [heads_q] or [batch, heads_q] (any strides,
  // on q's device). The score of query i and key j of sequence b, head h, after the scale and the
  // soft-cap, gets -slope[b, h] * |i + seq_k - seq_q - j|, with that sequence's own lengths
  // (packed sequences; a KV cache's cache_seqlens[b] keys). No gradient. Null: none.
  const TensorView* alibi_slopes = nullptr;
  AttentionTier tier = AttentionTier::automatic;
};

// q [batch, seq_q, heads_q, head_dim], k [batch, seq_k, heads_kv, head_dim], v [batch, seq_k,
// heads_kv, head_dim_v], out [batch, seq_q, heads_q, head_dim_v]: CUDA tensors of one dtype
// (float32, float16, bfloat16), any strides; heads_q a multiple of heads_kv (GQA, MQA); head
// dimensions up to 256. lse (optional) [batch, heads_q, seq_q] float32: the log-sum-exp of each
// row's scores (ALiBi's bias included: FlashAttention's causal kernels add slope * j instead, the
// same softmax, so their lse exceeds this one by slope * (i + seq_k - seq_q)). A query that sees
// no key gets output 0 and lse +inf (FlashAttention's convention: no NaN). Math in float32.
void attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
               const TensorView* lse, const AttentionOptions& options, cudaStream_t stream);

// Packed sequences of different lengths, as flash_attn_varlen_func takes them: q [total_q,
// heads_q, head_dim], k [total_k, heads_kv, head_dim], v [total_k, heads_kv, head_dim_v], out
// [total_q, heads_q, head_dim_v], lse (optional) [heads_q, total_q] float32; sequence b is rows
// cu_seqlens_q[b] .. cu_seqlens_q[b + 1] of q (and likewise of k and v), cu_seqlens int32 CUDA
// tensors of batch + 1 offsets from 0. The offsets are checked on the host (a copy and a wait on
// `stream`, so not inside a CUDA graph capture): non-decreasing, ending at the packed length, no
// sequence longer than max_seqlen_q / max_seqlen_k. Masks apply within each sequence.
void attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                      const TensorView* lse, const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                      int64_t max_seqlen_q, int64_t max_seqlen_k, const AttentionOptions& options,
                      cudaStream_t stream);

// Attention against a KV cache, as flash_attn_with_kvcache takes one (generation: a few new
// queries per sequence against the keys cached so far). Sequence b sees the first
// cache_seqlens[b] keys of its cache; causal aligns its last query with its last key.
//   block_table null: k_cache [batch, cache_len, heads_kv, head_dim], v_cache [batch, cache_len,
//     heads_kv, head_dim_v], any strides.
//   block_table [batch, max_blocks] int32 (a paged cache, as vLLM keeps one): k_cache
//     [num_blocks, block_size, heads_kv, head_dim], v_cache likewise; key j of sequence b is row
//     j % block_size of block block_table[b, j / block_size]. Any block size.
// q [batch, seq_q, heads_q, head_dim], out, lse and options as attention's; cache_seqlens [batch]
// int32. The lengths and block ids are read on the device only, so the call can be captured in a
// CUDA graph: a length outside [0, max_blocks * block_size] (cache_len without a table) or a block
// id outside [0, num_blocks) makes that sequence's output NaN, and nothing outside the cache is
// read. No backward: an inference op. Tiers: decode (seq_q <= 16) and generic.
void attention_kvcache(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                       const TensorView& out, const TensorView* lse, const TensorView& cache_seqlens,
                       const TensorView* block_table, const AttentionOptions& options, cudaStream_t stream);

// The gradients of attention(q, k, v, out, lse, options) for grad_out (the shape of out): dq, dk
// and dv with the shapes and dtype of q, k and v, any strides. lse is the forward's (required:
// the backward recomputes the probabilities from it). Summed in float32. dk and dv are summed in a
// fixed order; dq, on the sm90 tier, by atomic additions across key tiles whose order varies, so
// its last bits may differ from run to run, unless options.deterministic (then in a fixed order,
// at some cost in speed). The generic tier is always deterministic. A query that saw no key
// contributes nothing. Tiers: generic and sm90 (bfloat16/float16, head_dim = head_dim_v in {64,
// 128}, the head dimension of every tensor contiguous with 16-byte aligned rows).
void attention_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& out, const TensorView& lse, const TensorView& dq, const TensorView& dk,
                        const TensorView& dv, const AttentionOptions& options, cudaStream_t stream);

// The backward of attention_varlen: lse [heads_q, total_q], dq, dk, dv packed like q, k, v.
void attention_varlen_backward(const TensorView& grad_out, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& out, const TensorView& lse, const TensorView& dq,
                               const TensorView& dk, const TensorView& dv, const TensorView& cu_seqlens_q,
                               const TensorView& cu_seqlens_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                               const AttentionOptions& options, cudaStream_t stream);

// Rotary position embedding (RoPE), as FlashAttention's apply_rotary_emb: q_out, k_out = q, k with
// each pair of a head's first rotary_dim features rotated by the angle of its position,
// (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos); features past rotary_dim are copied.
//   q, k: (batch, seq, heads, head_dim) for bshd (FlashAttention's layout) or (batch, heads, seq,
//     head_dim) for bhsd (torch SDPA's); float32, float16 or bfloat16, the last dimension
//     contiguous; k may have fewer heads (GQA).
//   cos, sin: (positions, rotary_dim / 2) or (batch or 1, positions, rotary_dim / 2), float32 or
//     q's dtype: row p holds the angles of position p. Hugging Face's (batch or 1, positions,
//     head_dim), each angle twice (in halves, or in neighbours where interleaved), is taken too:
//     a last dimension of head_dim means that form (a partial rotary takes FlashAttention's).
//   interleaved: the pairs (2i, 2i + 1) (GPT-J); else (i, i + rotary_dim / 2) (GPT-NeoX, Llama).
//   The position of sequence index s is seqlen_offset + s, plus seqlen_offsets[b] (int32 or int64,
//   one per batch, for decode) where given; a position outside cos's rows gives NaN features.
//   q_out, k_out: q's and k's shapes and dtype, the last dimension contiguous; they may be q and k.
enum class RotaryLayout { bshd, bhsd };
void parse(const char* op, std::string_view name, RotaryLayout& out);  // "bshd", "bhsd"
void rotary_embedding(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                      RotaryLayout layout, bool interleaved, int64_t seqlen_offset, const TensorView* seqlen_offsets,
                      const TensorView& q_out, const TensorView& k_out, cudaStream_t stream = nullptr);
// The gradients of q and k from those of q_out and k_out: the opposite rotation.
void rotary_embedding_backward(const TensorView& grad_q, const TensorView& grad_k, const TensorView& cos,
                               const TensorView& sin, RotaryLayout layout, bool interleaved, int64_t seqlen_offset,
                               const TensorView* seqlen_offsets, const TensorView& grad_q_in,
                               const TensorView& grad_k_in, cudaStream_t stream = nullptr);

}  // namespace tessera
