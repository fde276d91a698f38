// Rotary position embedding (RoPE) of q and k, as FlashAttention's apply_rotary_emb: each pair of
// a head's first rotary_dim features is rotated by its position's angle,
//   (x1, x2) -> (x1 cos - x2 sin, x1 sin + x2 cos),
// the pairs (i, i + rotary_dim / 2) (GPT-NeoX, Llama) or (2i, 2i + 1) (GPT-J: interleaved); the
// features past rotary_dim are copied. The backward is the same rotation by the opposite angle (a
// rotation's inverse is its transpose), applied to the gradients. One launch covers q and k.
//
// Bytes: q and k read once and written once; cos and sin (positions x rotary_dim / 2) stay in L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "runtime/device.hpp"
#include "runtime/nvtx.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/op.hpp"
#include "tessera/ops/attention.hpp"
#include "tile/frag.cuh"

namespace tessera {

void parse(const char* op, std::string_view name, RotaryLayout& out) {
  if (name == "bshd") out = RotaryLayout::bshd;
  else if (name == "bhsd") out = RotaryLayout::bhsd;
  else detail::throw_arg(ErrorKind::value, op, "layout", "'bshd' or 'bhsd'", "'" + std::string(name) + "'");
}

namespace {

struct Rows {  // q or k: rows (batch, seq, head) of head_dim features, the last dimension contiguous
  const void* x;
  void* out;
  int64_t xs[3], os[3];  // strides of batch, seq, head in x and out (elements)
};

// A thread rotates the same item of up to kHeads heads of one position: their angles are the same,
// so it reads them once (read per row, they were twice q's and k's bytes in L2 loads).
constexpr int kHeads = 4;

struct RotaryArgs {
  Rows t[2];
  int64_t tokens, seq, heads[2];    // tokens: batch x seq
  int head_dim, half;               // half: rotary_dim / 2
  const void* cos;
  const void* sin;
  int64_t cb, cp, cj;               // cos/sin strides of batch (0: shared), position and pair
  int64_t positions;                // cos/sin rows
  int64_t offset;                   // the position of seq index 0 ...
  const void* offsets;              // ... or per batch (int32 or int64), where set
  bool offsets64, conjugate, interleaved;
  DType cos_dtype;
  int items;                        // per row: rotary items, then copied ones
  int rotary_items;
  bool angle_vec;                   // an item's angles by 16-byte loads (NeoX pairs, cj = 1, aligned)
};

// Head groups of q, then of k, per position.
__host__ __device__ inline int64_t head_groups(const RotaryArgs& a, int which) {
  return (a.heads[which] + kHeads - 1) / kHeads;
}

template <class C>
__device__ __forceinline__ float load_angle(const void* p, int64_t i) {
  return tile::to_float(static_cast<const C*>(p)[i]);
}

// V consecutive angles from p, aligned to 16 bytes, by 16-byte loads (one or two).
template <class C, int V>
__device__ __forceinline__ void load_angles(const C* p, float (&v)[V]) {
  constexpr int W = 16 / int(sizeof(C));
  static_assert(V % W == 0, "whole 16-byte loads");
#pragma unroll
  for (int k = 0; k < V; k += W) {
    float t[W];
    tile::unpack(tile::load_frag<C, W>(p + k), t);
#pragma unroll
    for (int e = 0; e < W; ++e) v[k + e] = t[e];
  }
}

// The cos and sin of pairs j .. j + N - 1 from angle0; cos NaN where the position is outside cos
// and sin (`valid` false), sin negated for the backward.
template <class C, int N>
__device__ __forceinline__ void item_angles(const RotaryArgs& a, int64_t angle0, bool valid, int j, float (&c)[N],
                                            float (&sn)[N]) {
  if constexpr (N % (16 / int(sizeof(C))) == 0) {
    if (a.angle_vec) {
      load_angles<C, N>(static_cast<const C*>(a.cos) + angle0 + j, c);
      load_angles<C, N>(static_cast<const C*>(a.sin) + angle0 + j, sn);
    }
  }
  if (!(N % (16 / int(sizeof(C))) == 0 && a.angle_vec)) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      c[e] = load_angle<C>(a.cos, angle0 + (j + e) * a.cj);
      sn[e] = load_angle<C>(a.sin, angle0 + (j + e) * a.cj);
    }
  }
  const float sign = a.conjugate ? -1.0f : 1.0f;
#pragma unroll
  for (int e = 0; e < N; ++e) c[e] = valid ? c[e] : NAN, sn[e] *= sign;
}

// One item: V features of a row (V pairs for NeoX, V / 2 interleaved, or V copied), in nh <= kHeads
// rows h stride apart. I is the index type of the item count: 32-bit where it fits, so that the
// position and head group come from 32-bit divisions (a 64-bit one is a long instruction sequence,
// and this kernel is otherwise a few loads and FMAs per 32 bytes moved). Every row's loads are
// issued before any store.
template <class T, class C, int V, class I>
__global__ void rotary_kernel(const RotaryArgs a) {
  const I g0 = I(head_groups(a, 0)), groups = g0 + I(head_groups(a, 1));
  const I total = I(a.tokens) * groups * I(a.items);
  for (I i = blockIdx.x * I(blockDim.x) + threadIdx.x; i < total; i += I(gridDim.x) * blockDim.x) {
    const I r = i / I(a.items), token = r / groups;
    const int item = int(i - r * I(a.items));
    int g = int(r - token * groups);
    const int which = g < int(g0) ? 0 : 1;
    if (which) g -= int(g0);
    const Rows& t = a.t[which];
    const int h0 = g * kHeads, nh = min(kHeads, int(a.heads[which]) - h0);
    const int64_t b = int64_t(token / I(a.seq)), s = int64_t(token) - b * a.seq;
    const T* x = static_cast<const T*>(t.x) + b * t.xs[0] + s * t.xs[1] + h0 * t.xs[2];
    T* out = static_cast<T*>(t.out) + b * t.os[0] + s * t.os[1] + h0 * t.os[2];
    tile::Frag<T, V> fu[kHeads], fw[kHeads];
    // NeoX: pairs (j, j + half), V of them from two fragments; interleaved: (2j, 2j + 1) in one
    // fragment (a lone element pairs with its neighbour, read beside it); copied: one fragment.
    const bool copied = item >= a.rotary_items, neox = !copied && !a.interleaved;
    const int c0 = copied ? 2 * a.half + (item - a.rotary_items) * V : item * V;
#pragma unroll
    for (int k = 0; k < kHeads; ++k) {
      if (k >= nh) break;
      fu[k] = tile::load_frag<T, V>(x + k * t.xs[2] + c0);
      if (neox) fw[k] = tile::load_frag<T, V>(x + k * t.xs[2] + c0 + a.half);
      else if (V == 1 && !copied) fw[k] = tile::load_frag<T, V>(x + k * t.xs[2] + (c0 ^ 1));
    }
    constexpr int P = V > 1 ? V / 2 : 1;  // interleaved pairs an item
    float c[V], sn[V], ci[P], si[P];
    if (!copied) {
      int64_t pos = a.offset + s;
      if (a.offsets) pos += a.offsets64 ? static_cast<const int64_t*>(a.offsets)[b] : static_cast<const int*>(a.offsets)[b];
      const bool valid = pos >= 0 && pos < a.positions;  // else NaN: no read outside cos and sin
      const int64_t angle0 = b * a.cb + (valid ? pos : 0) * a.cp;
      if (neox) item_angles<C, V>(a, angle0, valid, c0, c, sn);
      else item_angles<C, P>(a, angle0, valid, c0 / 2, ci, si);
    }
#pragma unroll
    for (int k = 0; k < kHeads; ++k) {
      if (k >= nh) break;
      float u[V], w[V];
      tile::unpack(fu[k], u);
      if (neox) {
        tile::unpack(fw[k], w);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const float x1 = u[e], x2 = w[e];
          u[e] = x1 * c[e] - x2 * sn[e], w[e] = x1 * sn[e] + x2 * c[e];
        }
        tile::store_frag<T, V>(out + k * t.os[2] + c0 + a.half, tile::pack<T, V>(w));
      } else if (!copied) {
        if constexpr (V == 1) {
          const bool odd = c0 & 1;
          const float other = fw[k][0];
          u[0] = odd ? other * si[0] + u[0] * ci[0] : u[0] * ci[0] - other * si[0];
        } else {
#pragma unroll
          for (int e = 0; e < V; e += 2) {
            const float x1 = u[e], x2 = u[e + 1];
            u[e] = x1 * ci[e / 2] - x2 * si[e / 2], u[e + 1] = x1 * si[e / 2] + x2 * ci[e / 2];
          }
        }
      }
      tile::store_frag<T, V>(out + k * t.os[2] + c0, tile::pack<T, V>(u));
    }
  }
}

struct RotaryCtx {
  int sms;
};

// The 16-byte fragments where every row and half starts on 16 bytes; single elements otherwise.
template <class T, class C, int V>
struct RotaryTier {
  static constexpr const char* kName = V > 1 ? "vector" : "scalar";
  static constexpr const char* kWhen = V > 1 ? "rows and halves 16-byte aligned" : "any alignment";
  struct Plan {
    unsigned grid;
    std::string describe() const { return std::to_string(grid) + " blocks of 256"; }
  };
  static bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
  static bool can_implement(const RotaryArgs& a, const RotaryCtx&) {
    if (V == 1) return true;
    bool ok = a.half % V == 0 && a.head_dim % V == 0;
    for (const Rows& t : a.t) {
      ok = ok && aligned(t.x) && aligned(t.out);
      for (int d = 0; d < 3; ++d) ok = ok && t.xs[d] % V == 0 && t.os[d] % V == 0;
    }
    return ok;
  }
  static Plan plan(const RotaryArgs& a, const RotaryCtx& c) {
    const int64_t work = a.tokens * (head_groups(a, 0) + head_groups(a, 1)) * int64_t(items(a));
    return {runtime::grid_cap(std::min<int64_t>(runtime::ceil_div(work, 256), int64_t(c.sms) * 16))};
  }
  static int items(const RotaryArgs& a) {
    const int rotary = a.interleaved ? 2 * a.half / V : a.half / V;
    return rotary + (a.head_dim - 2 * a.half) / V;
  }
  static void launch(const RotaryArgs& args, const Plan& p, cudaStream_t stream) {
    RotaryArgs a = args;
    a.rotary_items = a.interleaved ? 2 * a.half / V : a.half / V;
    a.items = items(a);
    constexpr int64_t W = 16 / int64_t(sizeof(C));  // angles per 16-byte load
    a.angle_vec = V > 1 && V % W == 0 && !a.interleaved && a.cj == 1 && aligned(a.cos) && aligned(a.sin) &&
                  a.cb % W == 0 && a.cp % W == 0;
    const int64_t reach =
        a.tokens * (head_groups(a, 0) + head_groups(a, 1)) * int64_t(a.items) + int64_t(p.grid) * 256;
    if (reach < (int64_t(1) << 32)) rotary_kernel<T, C, V, uint32_t><<<p.grid, 256, 0, stream>>>(a);
    else rotary_kernel<T, C, V, int64_t><<<p.grid, 256, 0, stream>>>(a);
  }
};

template <class T, class C>
void run(const char* op, const RotaryArgs& a, const RotaryCtx& ctx, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  runtime::run_first<RotaryTier<T, C, V>, RotaryTier<T, C, 1>>(op, a, ctx, stream);
}

template <class T>
void run_dtype(const char* op, const RotaryArgs& a, const RotaryCtx& ctx, cudaStream_t stream) {
  if (a.cos_dtype == DType::float32) run<T, float>(op, a, ctx, stream);
  else run<T, T>(op, a, ctx, stream);
}

// q/k (and their outputs) as rows: dims 0..3 are (batch, seq, heads, head_dim) or (batch, heads,
// seq, head_dim).
Rows rows_of(const TensorView& x, const TensorView& out, RotaryLayout layout) {
  const int s = layout == RotaryLayout::bshd ? 1 : 2, h = layout == RotaryLayout::bshd ? 2 : 1;
  return {x.data, out.data, {x.strides[0], x.strides[s], x.strides[h]}, {out.strides[0], out.strides[s], out.strides[h]}};
}

// The tensor arguments' names in errors: the forward's, or the backward's (grad_q, ...).
struct Names {
  const char *q, *k, *q_out, *k_out;
};

void check_qk(const char* op, const char* name, const TensorView& t, const char* q_name, const TensorView& q,
              RotaryLayout layout) {
  const int s = layout == RotaryLayout::bshd ? 1 : 2;
  detail::check_cuda_tensor(op, name, t);
  detail::check_dtype_in(op, name, t, {DType::float32, DType::float16, DType::bfloat16});
  if (t.ndim != 4)
    detail::throw_arg(ErrorKind::value, op, name, "a 4-d tensor (batch, seq, heads, head_dim) or (batch, heads, seq, head_dim)", detail::dims(t));
  if (t.strides[3] != 1 && t.shape[3] > 1)
    detail::throw_arg(ErrorKind::value, op, name, "its last dimension contiguous (stride 1)", "stride " + std::to_string(t.strides[3]));
  if (&t != &q) {
    detail::check_same_dtype(op, name, t, q_name, q);
    detail::check_same_device(op, name, t, q_name, q);
    if (t.shape[0] != q.shape[0] || t.shape[s] != q.shape[s] || t.shape[3] != q.shape[3])
      detail::throw_arg(ErrorKind::value, op, name, std::string(q_name) + "'s batch, seq and head_dim " + q.shape_str(), t.shape_str());
  }
}

void check_angles(const char* op, const char* name, const TensorView& c, const char* q_name, const TensorView& q,
                  int64_t batch) {
  detail::check_cuda_tensor(op, name, c);
  detail::check_same_device(op, name, c, q_name, q);
  if (c.dtype != DType::float32 && c.dtype != q.dtype)
    detail::throw_arg(ErrorKind::type, op, name, std::string("float32 or ") + q_name + "'s dtype " + dtype_name(q.dtype), dtype_name(c.dtype));
  const bool ok = (c.ndim == 2 || (c.ndim == 3 && (c.shape[0] == 1 || c.shape[0] == batch))) &&
                  (c.strides[c.ndim - 1] == 1 || c.shape[c.ndim - 1] == 1);
  if (!ok)
    detail::throw_arg(ErrorKind::value, op, name, "(positions, rotary_dim / 2) or (batch or 1, positions, rotary_dim / 2 or head_dim), the last dimension contiguous", detail::dims(c) + " " + c.shape_str());
}

void rotate(const char* op, const Names& nm, const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
            RotaryLayout layout, bool interleaved, int64_t seqlen_offset, const TensorView* seqlen_offsets,
            bool conjugate, const TensorView& q_out, const TensorView& k_out, cudaStream_t stream) {
  check_qk(op, nm.q, q, nm.q, q, layout);
  check_qk(op, nm.k, k, nm.q, q, layout);
  check_angles(op, "cos", cos, nm.q, q, q.shape[0]);
  check_angles(op, "sin", sin, nm.q, q, q.shape[0]);
  detail::check_like(op, "sin", sin, "cos", cos);
  const int64_t dim = q.shape[3];
  // Hugging Face's form: a row of head_dim angles, each pair's twice (halves equal, or neighbours
  // equal where interleaved): every pair's angle read once.
  const bool hf = cos.shape[cos.ndim - 1] == dim && dim > 1;
  const int64_t half = hf ? dim / 2 : cos.shape[cos.ndim - 1];
  if (2 * half > dim || half < 1)
    detail::throw_arg(ErrorKind::value, op, "cos", "rotary_dim / 2 columns, 1 to head_dim / 2 = " + std::to_string(dim / 2), std::to_string(half));
  const int s = layout == RotaryLayout::bshd ? 1 : 2;
  const int64_t positions = cos.shape[cos.ndim - 2], seq = q.shape[s];
  if (!seqlen_offsets && (seqlen_offset < 0 || seqlen_offset + seq > positions))
    detail::throw_arg(ErrorKind::value, op, "cos", "a row per position, seqlen_offset + seq = " + std::to_string(seqlen_offset + seq) + " of them at least", std::to_string(positions));
  if (seqlen_offsets) {
    detail::check_cuda_tensor(op, "seqlen_offsets", *seqlen_offsets);
    detail::check_dtype_in(op, "seqlen_offsets", *seqlen_offsets, {DType::int32, DType::int64});
    if (seqlen_offsets->ndim != 1 || seqlen_offsets->shape[0] != q.shape[0] || (q.shape[0] > 1 && seqlen_offsets->strides[0] != 1))
      detail::throw_arg(ErrorKind::value, op, "seqlen_offsets", "a contiguous 1-d tensor of batch = " + std::to_string(q.shape[0]) + " offsets", detail::dims(*seqlen_offsets));
  }
  const std::pair<const char*, const TensorView*> outs[] = {{nm.q_out, &q_out}, {nm.k_out, &k_out}};
  const std::pair<const char*, const TensorView*> ins[] = {{nm.q, &q}, {nm.k, &k}, {"cos", &cos}, {"sin", &sin}};
  for (int i = 0; i < 2; ++i) {
    detail::check_like(op, outs[i].first, *outs[i].second, i ? nm.k : nm.q, i ? k : q);
    detail::check_no_internal_overlap(op, outs[i].first, *outs[i].second);
    for (const auto& [name, t] : ins) detail::check_no_overlap(op, outs[i].first, *outs[i].second, name, *t, true);
    if (outs[i].second->strides[3] != 1 && dim > 1)
      detail::throw_arg(ErrorKind::value, op, outs[i].first, "its last dimension contiguous", "stride " + std::to_string(outs[i].second->strides[3]));
  }
  detail::check_no_overlap(op, nm.k_out, k_out, nm.q_out, q_out, false);
  if (q.numel() + k.numel() == 0) return;
  RotaryArgs a{};
  a.t[0] = rows_of(q, q_out, layout), a.t[1] = rows_of(k, k_out, layout);
  a.tokens = q.shape[0] * seq, a.seq = seq, a.heads[0] = q.shape[s == 1 ? 2 : 1], a.heads[1] = k.shape[s == 1 ? 2 : 1];
  a.head_dim = int(dim), a.half = int(half);
  a.cos = cos.data, a.sin = sin.data, a.cos_dtype = cos.dtype;
  a.cb = cos.ndim == 3 && cos.shape[0] > 1 ? cos.strides[0] : 0, a.cp = cos.strides[cos.ndim - 2];
  a.cj = hf && interleaved ? 2 : 1;
  a.positions = positions, a.offset = seqlen_offset;
  a.offsets = seqlen_offsets ? seqlen_offsets->data : nullptr;
  a.offsets64 = seqlen_offsets && seqlen_offsets->dtype == DType::int64;
  a.conjugate = conjugate, a.interleaved = interleaved;
  runtime::DeviceGuard guard(q.device.index);
  const RotaryCtx ctx{runtime::device_props(q.device.index).multiProcessorCount};
  switch (q.dtype) {
    case DType::float32: run<float, float>(op, a, ctx, stream); break;
    case DType::float16: run_dtype<__half>(op, a, ctx, stream); break;
    default: run_dtype<__nv_bfloat16>(op, a, ctx, stream); break;
  }
  TESSERA_LAUNCH_CHECK();
}

}  // namespace

void rotary_embedding(const TensorView& q, const TensorView& k, const TensorView& cos, const TensorView& sin,
                      RotaryLayout layout, bool interleaved, int64_t seqlen_offset, const TensorView* seqlen_offsets,
                      const TensorView& q_out, const TensorView& k_out, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rotary_embedding");
  rotate("rotary_embedding", {"q", "k", "q_out", "k_out"}, q, k, cos, sin, layout, interleaved, seqlen_offset, seqlen_offsets, false, q_out,
         k_out, stream);
}

void rotary_embedding_backward(const TensorView& grad_q, const TensorView& grad_k, const TensorView& cos,
                               const TensorView& sin, RotaryLayout layout, bool interleaved, int64_t seqlen_offset,
                               const TensorView* seqlen_offsets, const TensorView& grad_q_in,
                               const TensorView& grad_k_in, cudaStream_t stream) {
  runtime::NvtxRange range("tessera::rotary_embedding_backward");
  rotate("rotary_embedding_backward", {"grad_q", "grad_k", "grad_q_in", "grad_k_in"}, grad_q, grad_k, cos, sin, layout, interleaved, seqlen_offset, seqlen_offsets,
         true, grad_q_in, grad_k_in, stream);
}

namespace {
const char* const kRotaryArgs =
    "Tensor cos, Tensor sin, *, str layout='bshd', bool interleaved=False, int seqlen_offset=0, "
    "Tensor? seqlen_offsets=None) -> (Tensor, Tensor)";
const OpRegistrar kRotary = describe("rotary_embedding", "attention", "RoPE: q and k rotated by their positions' angles")
    .schema(std::string("rotary_embedding(Tensor q, Tensor k, ") + kRotaryArgs)
    .kernel<&rotary_embedding>({"q", "k", "cos", "sin", "layout", "interleaved", "seqlen_offset", "seqlen_offsets",
                                "q_out", "k_out"},
                               {{"q_out", "q"}, {"k_out", "k"}})
    .differentiable("rotary_embedding_backward",
                    {"grad", "grad1", "cos", "sin", "layout", "interleaved", "seqlen_offset", "seqlen_offsets"},
                    {"q", "k"});
const OpRegistrar kRotaryBackward =
    describe("rotary_embedding_backward", "attention", "rotary_embedding backward: the opposite rotation")
        .schema(std::string("rotary_embedding_backward(Tensor grad_q, Tensor grad_k, ") + kRotaryArgs)
        .kernel<&rotary_embedding_backward>({"grad_q", "grad_k", "cos", "sin", "layout", "interleaved",
                                             "seqlen_offset", "seqlen_offsets", "grad_q_in", "grad_k_in"},
                                            {{"grad_q_in", "grad_q"}, {"grad_k_in", "grad_k"}});
}  // namespace
}  // namespace tessera
