// What the Hopper backward's kernels share (attention_backward_sm90_kernel.cuh, the multiplies;
// attention_backward_sm90_rows.cu, the row-wise passes before and after): the tiles, and how the
// two consumer warpgroups share dQ's product, which sets dq_acc's layout.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "ops/attention/attention.cuh"

namespace tessera::attn::sm90_bwd {

constexpr int kBM = 64;   // queries per step
constexpr int kBN = 128;  // keys per CTA: 64 per consumer warpgroup

// dQ = dS K over the CTA's 128 keys: at head_dim 128 each consumer multiplies half of dQ's
// columns over all the keys (both consumers' dS^T first in shared memory: they meet each step);
// at 64, where the elementwise work per step weighs more against the multiplies, each multiplies
// all the columns over its own 64 keys (split-K: no meeting, so one consumer's softmax runs under
// the other's multiplies, for twice the additions into dq_acc). A dq_acc tile (64 queries) is
// kParts column blocks of kCols columns, one consumer's product each (split-K: both add into one).
template <int D_>
struct Shape {
  static constexpr int D = D_, kChunks = D / 64;
  static constexpr bool kSplitK = D == 64;
  static constexpr int kCols = kSplitK ? D : D / 2;  // columns of a consumer's dQ product
  static constexpr int kParts = kSplitK ? 1 : 2;     // column blocks of a dq_acc tile
  static constexpr int kStages = kSplitK ? 3 : 2;    // Q, dO, lse and delta of steps in flight
};

// Before the multiplies: delta = rowsum(dO * O) and lse in log2 units, in the padded [batch *
// heads_q][m_blocks * kBM] layout (padding rows: lse2 +inf, so P = 0, and delta 0).
void prepare(const Params& p, const BackwardArgs& a, float* lse2, float* delta, int64_t m_blocks,
             cudaStream_t stream);

// After: dq = scale * dq_acc ([batch * heads_q][m_blocks][kParts][kBM * kCols], each block in the
// accumulator order the consumers stage it in) in dq's dtype and strides.
void finish_dq(const Params& p, const BackwardArgs& a, const float* dq_acc, int64_t m_blocks, cudaStream_t stream);

// With the group split over CTAs (split > 1): dk, dv = the sum over the parts of dk_parts and
// dv_parts (float32, [split][rows_k][heads_kv][D] each, contiguous), in dk's and dv's dtype and
// strides.
void sum_parts(const Params& p, const BackwardArgs& a, const float* dk_parts, const float* dv_parts, int split,
               cudaStream_t stream);

}  // namespace tessera::attn::sm90_bwd
