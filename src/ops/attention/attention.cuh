// What the attention tiers share: the arguments as the launcher resolved them, and the tiers'
// entry points. attention.cu checks the arguments and runs the first tier that takes them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tessera/ops/attention.hpp"
#include "tessera/tensor.hpp"

namespace tessera::attn {

constexpr int kMaxHeadDim = 256;  // what the generic kernels hold in registers

struct Strides {
  int64_t b, s, h, d;  // elements
};
inline Strides strides_of(const TensorView& t) { return {t.strides[0], t.strides[1], t.strides[2], t.strides[3]}; }

// The forward's argument checks (attention.cu), naming `op` in errors; lse may be null.
void check_arguments(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const TensorView* lse, const AttentionOptions& o);

struct Params {
  DType dtype;
  int device;
  const void *q, *k, *v;
  void* out;
  float* lse;  // nullable; [batch, heads_q, seq_q] contiguous
  Strides sq, sk, sv, so;
  int64_t batch, seq_q, seq_k, heads_q, group, dim, dim_v;
  float scale, softcap;  // softcap 0: none
  bool causal;
  int64_t window_left, window_right;  // -1: unbounded
};

// The keys query row i (of seq_q) sees: [lo, hi], the diagonal shifted by seq_k - seq_q so that
// the last query sees the last key (FlashAttention's bottom-right alignment). Empty when hi < lo.
struct KeyRange {
  int64_t lo, hi;
};
__host__ __device__ inline KeyRange key_range(int64_t i, int64_t seq_q, int64_t seq_k, bool causal,
                                              int64_t window_left, int64_t window_right) {
  const int64_t diag = i + seq_k - seq_q;
  int64_t hi = causal ? diag : seq_k - 1;
  if (window_right >= 0 && diag + window_right < hi) hi = diag + window_right;
  if (hi > seq_k - 1) hi = seq_k - 1;
  int64_t lo = window_left >= 0 ? diag - window_left : 0;
  if (lo < 0) lo = 0;
  return {lo, hi};
}

// The Hopper tier (attention_sm90.cu): TMA, wgmma, warp-specialized; bf16 and fp16, head_dim =
// head_dim_v in {64, 128, 256}, the head dimension contiguous and the other strides the copy
// engine can address.
bool sm90_can_implement(const Params& p);
void sm90_launch(const Params& p, cudaStream_t stream);

}  // namespace tessera::attn
