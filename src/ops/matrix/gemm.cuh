// What every GEMM kernel tier shares: the arguments as the launcher resolved them, the fused
// epilogue, and the order in which a persistent grid walks the output tiles.
//
// C[b] = A[b] B[b] with A [M, K], B [K, N], C [M, N], each with its own element strides (batch
// stride 0: one matrix shared by every batch). The epilogue turns the float32 accumulator of one
// element into its stored value: activation(alpha * acc + bias[n]) + residual[b, m, n] +
// beta * C[b, m, n], and optionally stores alpha * acc + bias[n] as well (the pre-activation).
// The gated activations (swiglu, geglu) pair columns instead (C has N / 2 of them, out_cols): only
// the sm90 tier takes them, in its own epilogue (gemm_sm90_swiglu.cuh); the other tiers refuse them.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tessera/ops/matrix.hpp"
#include "tessera/tensor.hpp"
#include "tile/activation.cuh"
#include "tile/bulk.cuh"
#include "tile/convert.cuh"

namespace tessera::matrix {

// scaled_mm's block-wise scales: blocks of this many values along K (1 x 128 for A's rows,
// 128 x 128 for B).
constexpr int kScaleBlock = 128;

// A launch configuration the autotuner may choose (0 in a field: the tiers' own rule), spelt in
// the tune cache as to_string gives it: "schedule=pingpong,group=8,splits=1".
struct GemmConfig {
  int schedule = 0;  // sm90: 0 the rule, 1 cooperative, 2 pingpong
  int group = 0;     // tile-rows per group of the raster order (TileOrder); 0: 8
  int splits = 0;    // sm90 cooperative: chunks of K of the last wave's tiles: 0 the rule, 1 none
  bool operator==(const GemmConfig& o) const {
    return schedule == o.schedule && group == o.group && splits == o.splits;
  }
};

inline std::string to_string(const GemmConfig& c) {
  const char* sched[] = {"auto", "cooperative", "pingpong"};
  return std::string("schedule=") + sched[c.schedule] + ",group=" + std::to_string(c.group) +
         ",splits=" + std::to_string(c.splits);
}

// The config of to_string's spelling; false (and `c` unspecified) for anything else.
inline bool parse_config(const std::string& s, GemmConfig& c) {
  c = {};
  char sched[16] = {};
  int used = 0;
  if (std::sscanf(s.c_str(), "schedule=%15[a-z],group=%d,splits=%d%n", sched, &c.group, &c.splits,
                  &used) != 3 || used != int(s.size()))
    return false;
  const std::string v = sched;
  c.schedule = v == "auto" ? 0 : v == "cooperative" ? 1 : v == "pingpong" ? 2 : -1;
  return c.schedule >= 0 && c.group >= 0 && c.group <= 64 && c.splits >= 0 && c.splits <= 64;
}

struct GemmArgs {
  DType dtype = DType::bfloat16;      // of A and B
  DType out_dtype = DType::bfloat16;  // of C, bias and residual
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int64_t a_sb = 0, a_sm = 0, a_sk = 0;
  int64_t b_sb = 0, b_sk = 0, b_sn = 0;
  int64_t c_sb = 0, c_sm = 0, c_sn = 0;
  const void* bias = nullptr;
  int64_t bias_sn = 0;
  const void* residual = nullptr;
  int64_t r_sb = 0, r_sm = 0, r_sn = 0;
  void* z = nullptr;  // the pre-activation output (MatmulOptions::preactivation), [M, N]
  int64_t z_sb = 0, z_sm = 0, z_sn = 0;
  float alpha = 1.0f, beta = 0.0f;
  // scaled_mm: device scalars multiplying alpha; or, where `scale_rowwise`, M floats (one per row of
  // A) and N floats (one per column of B), for one matrix (batch 1) of float8 inputs.
  const float* scale_a = nullptr;
  const float* scale_b = nullptr;
  bool scale_rowwise = false;
  // Or, where `scale_blockwise`, one scale per block of kScaleBlock values along K: scale_a
  // [M, ceil(K / 128)] (a row's 1 x 128 blocks, strides sa_sm, sa_sk) and scale_b
  // [ceil(K / 128), ceil(N / 128)] (B's 128 x 128 blocks, strides sb_sk, sb_sn), or, where
  // `sb_columns`, [ceil(K / 128), N] (1 x 128 blocks of B's columns: the weight gradient's
  // operands, both activations); float8 inputs.
  bool scale_blockwise = false, sb_columns = false;
  int64_t sa_sm = 0, sa_sk = 0, sb_sk = 0, sb_sn = 0;
  Activation activation = Activation::none;
  bool allow_tf32 = false;
  GemmConfig config;
  int device = 0;
  // Grouped (grouped_mm's 2-d x 3-d form): the rows in `groups` groups by `offs` (int32, on the
  // device, the groups' cumulative ends): rows [offs[g - 1], offs[g]) (offs[-1] = 0) times B's
  // batch g (stride b_sb); A and C 2-d (batch 1). Rows past the last end are zeroed. Ends that
  // decrease or pass M are clamped (the later group empty, M), never read past.
  const int32_t* offs = nullptr;
  int64_t groups = 0;
  // Grouped over K instead (grouped_mm's depth form): C's batch g (batch = groups) is the product
  // over K's rows [offs[g - 1], offs[g]); A and B 2-d.
  bool offs_over_k = false;
};

// C's columns: N, or N / 2 with a gated activation (gate and up columns in, one output out).
inline int64_t out_cols(const GemmArgs& g) { return is_gated(g.activation) ? g.n / 2 : g.n; }

struct GemmCtx {
  int sms = 0;
  int major = 0;
};

// The epilogue as kernels take it, typed by the output dtype.
//
// Kernels store through it in one of two ways: `store` one element at a time (any layout), or
// `with_activation` once per block of outputs, which calls back with the activation as a type,
// then `cols` once per pair of neighbouring columns, `row` once per row and `store_pair` per
// pair: the activation's switch, the bias loads and the 64-bit row arithmetic happen once, not
// per element.
template <class OutT>
struct Epilogue {
  OutT* c;
  int64_t c_sb, c_sm, c_sn;
  const OutT* bias;
  int64_t bias_sn;
  const OutT* residual;
  int64_t r_sb, r_sm, r_sn;
  OutT* z;  // where set, alpha * acc + bias is stored there too (before the activation)
  int64_t z_sb, z_sm, z_sn;
  float alpha, beta;
  const float* scale_a;  // where set, alpha is multiplied by *scale_a * *scale_b (resolved())
  const float* scale_b;
  Activation activation;
  bool pairs;  // C's (and z's) rows contiguous, every even column's element aligned for a pair store
  bool prefetch;  // beta != 0 and C's rows 16-byte aligned: prefetch_row may bring them into L2
  // Row-wise scales instead (GemmArgs::scale_rowwise; scale_a and scale_b then null): they differ
  // per element, so alpha cannot carry them; the kernels that take float8 inputs (sm90, the SIMT
  // tier's generic kernel) multiply their float32 accumulators by row_scales[m] * col_scales[n]
  // before the epilogue.
  const float* row_scales;
  const float* col_scales;
  // Block scales instead (GemmArgs::scale_blockwise): they differ per block of kScaleBlock along
  // K, so the float8 kernels scale each block's partial sums before adding them up (block_a,
  // block_b) and the epilogue stores the sums as any product.
  const float* blocks_a;
  const float* blocks_b;
  int64_t ba_sm, ba_sk, bb_sk, bb_sn;
  bool b_columns;  // blocks_b one per column of B (1 x 128 blocks), else per 128 columns

  static Epilogue from(const GemmArgs& g) {
    auto* c = static_cast<OutT*>(g.c);
    const int64_t e = sizeof(OutT);
    auto* z = static_cast<OutT*>(g.z);
    const auto pairable = [](const OutT* p, int64_t sb, int64_t sm, int64_t sn) {
      return !p || (sn == 1 && sm % 2 == 0 && sb % 2 == 0 &&
                    reinterpret_cast<uintptr_t>(p) % (2 * sizeof(OutT)) == 0);
    };
    const bool pairs = pairable(c, g.c_sb, g.c_sm, g.c_sn) && pairable(z, g.z_sb, g.z_sm, g.z_sn);
    const auto per_tensor = [&](const float* s) { return g.scale_rowwise || g.scale_blockwise ? nullptr : s; };
    const auto blocks = [&](const float* s) { return g.scale_blockwise ? s : nullptr; };
    const auto row_wise = [&](const float* s) { return g.scale_rowwise ? s : nullptr; };
    const bool prefetch = g.beta != 0.0f && g.c_sn == 1 && reinterpret_cast<uintptr_t>(c) % 16 == 0 &&
                          g.c_sm * e % 16 == 0 && g.c_sb * e % 16 == 0;
    return {c, g.c_sb, g.c_sm, g.c_sn,
            static_cast<const OutT*>(g.bias), g.bias_sn,
            static_cast<const OutT*>(g.residual), g.r_sb, g.r_sm, g.r_sn,
            z, g.z_sb, g.z_sm, g.z_sn,
            g.alpha, g.beta, per_tensor(g.scale_a), per_tensor(g.scale_b), g.activation, pairs, prefetch,
            row_wise(g.scale_a), row_wise(g.scale_b),
            blocks(g.scale_a), blocks(g.scale_b), g.sa_sm, g.sa_sk, g.sb_sk, g.sb_sn, g.sb_columns};
  }

  // Asks for `cols` old output elements of row (b, m) from column `col` (16-byte aligned, as
  // `prefetch` says) in L2, ahead of the epilogue's reads: a hint, sm_90's bulk prefetch.
  __device__ __forceinline__ void prefetch_row(int64_t b, int64_t m, int64_t col, int64_t cols) const {
    const auto bytes = uint32_t(cols * int64_t(sizeof(OutT))) / 16 * 16;
    if (bytes) tile::bulk_prefetch_l2(c + b * c_sb + m * c_sm + col, bytes);
  }

  // This epilogue with the per-tensor device scales folded into alpha: what kernels store through.
  __device__ __forceinline__ Epilogue resolved() const {
    Epilogue e = *this;
    if (scale_a) e.alpha *= *scale_a;
    if (scale_b) e.alpha *= *scale_b;
    e.scale_a = e.scale_b = nullptr;
    return e;
  }

  // Row-wise: the scale of output row `row` of m, of column `col` of n; 0 past the output (whose
  // values are never stored), where there is no scale to read.
  __device__ __forceinline__ float row_scale(int64_t row, int64_t m) const {
    return row < m ? __ldg(row_scales + row) : 0.0f;
  }
  __device__ __forceinline__ float col_scale(int64_t col, int64_t n) const {
    return col < n ? __ldg(col_scales + col) : 0.0f;
  }

  // Block-wise: the scale of row `row`'s K block `kb` (0 past the output's rows, never stored),
  // and of B's block of K block `kb` that holds column `col` (of n).
  __device__ __forceinline__ float block_a(int64_t row, int64_t kb, int64_t m) const {
    return row < m ? __ldg(blocks_a + row * ba_sm + kb * ba_sk) : 0.0f;
  }
  __device__ __forceinline__ float block_b(int64_t kb, int64_t col, int64_t n) const {
    return col < n ? __ldg(blocks_b + kb * bb_sk + (b_columns ? col : col / kScaleBlock) * bb_sn) : 0.0f;
  }

  // Element (b, m, n) from its accumulator. Fast: the MUFU forms of the activations, for
  // half-type outputs.
  template <bool Fast>
  __device__ __forceinline__ void store(int64_t b, int64_t m, int64_t n, float acc) const {
    with_activation<Fast>([&](auto act) { store_pair(row(b, m), cols(n, false), acc, 0.0f, act); });
  }

  // Calls f(act) with the activation functor of this epilogue.
  template <bool Fast, class F>
  __device__ __forceinline__ void with_activation(F&& f) const {
    switch (activation) {
      case Activation::relu: f(tile::Relu{}); break;
      case Activation::gelu: f(tile::GeluErf<Fast>{}); break;
      case Activation::gelu_tanh: f(tile::GeluTanh<Fast>{}); break;
      case Activation::silu: f(tile::Silu<Fast>{}); break;
      default: f(Identity{}); break;
    }
  }

  struct Row {
    OutT* c;
    const OutT* residual;
    OutT* z;
  };
  struct Cols {
    int64_t n;
    bool both;  // column n + 1 too
    float bias0, bias1;
  };

  // Columns n and, where `both`, n + 1 (n even where `pairs` is to be used), their bias loaded.
  __device__ __forceinline__ Cols cols(int64_t n, bool both) const {
    Cols k{n, both, 0.0f, 0.0f};
    if (bias) {
      k.bias0 = tile::to_float(bias[n * bias_sn]);
      if (both) k.bias1 = tile::to_float(bias[(n + 1) * bias_sn]);
    }
    return k;
  }

  // The pointers of output row (b, m).
  __device__ __forceinline__ Row row(int64_t b, int64_t m) const {
    return {c + b * c_sb + m * c_sm, residual ? residual + b * r_sb + m * r_sm : nullptr,
            z ? z + b * z_sb + m * z_sm : nullptr};
  }

  // The elements of columns `k` of row `r`.
  template <class Act>
  __device__ __forceinline__ void store_pair(const Row& r, const Cols& k, float acc0, float acc1,
                                             Act act) const {
    const int64_t n = k.n;
    const bool both = k.both;
    const float z0 = alpha * acc0 + k.bias0, z1 = alpha * acc1 + k.bias1;
    if (r.z) {
      OutT* q = r.z + n * z_sn;
      if (both && pairs) {
        *reinterpret_cast<Pair*>(q) = Pair{tile::from_float<OutT>(z0), tile::from_float<OutT>(z1)};
      } else {
        *q = tile::from_float<OutT>(z0);
        if (both) q[z_sn] = tile::from_float<OutT>(z1);
      }
    }
    float v0 = act(z0), v1 = act(z1);
    if (r.residual) {
      v0 += tile::to_float(r.residual[n * r_sn]);
      if (both) v1 += tile::to_float(r.residual[(n + 1) * r_sn]);
    }
    OutT* p = r.c + n * c_sn;
    if (both && pairs) {
      if (beta != 0.0f) {
        const Pair old = *reinterpret_cast<const Pair*>(p);
        v0 += beta * tile::to_float(old.x), v1 += beta * tile::to_float(old.y);
      }
      *reinterpret_cast<Pair*>(p) = Pair{tile::from_float<OutT>(v0), tile::from_float<OutT>(v1)};
      return;
    }
    if (beta != 0.0f) v0 += beta * tile::to_float(*p);
    *p = tile::from_float<OutT>(v0);
    if (both) {
      if (beta != 0.0f) v1 += beta * tile::to_float(p[c_sn]);
      p[c_sn] = tile::from_float<OutT>(v1);
    }
  }

 private:
  struct Identity {
    __device__ __forceinline__ float operator()(float x) const { return x; }
  };
  struct alignas(2 * sizeof(OutT)) Pair {
    OutT x, y;
  };
};

// A block of outputs staged as float32 accumulators in shared memory, through the epilogue:
// `rows` x `cols` (<= Cols) elements at `buf` (rows `ld` floats apart, 16-byte aligned) to rows
// row0.. and columns col0.. (even) of batch b, by Threads threads (`tid`), four columns a thread
// and a row segment per Cols / 4 threads. The activation is chosen and the bias loaded once per
// call. Kernels call it from one place, in a loop over their passes that is not unrolled: each
// activation's code then appears once in the kernel, not once per accumulator of an unrolled
// store (which would make the epilogue most of the kernel's code and of ptxas's time). Inlined,
// not a call: the accumulators of later passes, still in registers, would be saved around a call.
// `kernel_epi` is the kernel's argument, resolved here (after the main loop, so that the scaled
// alpha holds no register through it).
template <int Cols, int Threads, class OutT>
__device__ __forceinline__ void store_staged(const Epilogue<OutT>& kernel_epi, const float* buf,
                                             int ld, int64_t b, int64_t row0, int64_t col0, int rows,
                                             int cols, int tid) {
  static_assert(Cols % 4 == 0 && Threads % (Cols / 4) == 0, "whole rows of quads per step");
  constexpr int kQuads = Cols / 4, kRowsPerStep = Threads / kQuads;
  const Epilogue<OutT> e = kernel_epi.resolved();
  const int c = 4 * (tid % kQuads);
  if (c >= cols) return;
  const auto lo = e.cols(col0 + c, c + 1 < cols);
  const bool hi = c + 2 < cols;
  const auto hi_cols = e.cols(col0 + (hi ? c + 2 : c), c + 3 < cols);
  e.template with_activation<!std::is_same_v<OutT, float>>([&](auto act) {
#pragma unroll 1
    for (int r = tid / kQuads; r < rows; r += kRowsPerStep) {
      const float4 v = *reinterpret_cast<const float4*>(&buf[r * ld + c]);
      const auto row = e.row(b, row0 + r);
      e.store_pair(row, lo, v.x, v.y, act);
      if (hi) e.store_pair(row, hi_cols, v.z, v.w, act);
    }
  });
}

// Output tiles in grouped order: tiles come `group` tile-rows at a time, down each column of
// the group before the next column, so that the CTAs running at once share the A tiles of a few
// rows and the B tiles of a few columns in L2. Batches follow each other.
struct TileOrder {
  int tiles_m = 0, tiles_n = 0, group = 8;
  int64_t batch = 1;

  __host__ __device__ int64_t count() const { return int64_t(tiles_m) * tiles_n * batch; }

  __device__ __forceinline__ void at(int64_t t, int64_t& b, int& tm, int& tn) const {
    const int64_t per = int64_t(tiles_m) * tiles_n;
    b = t / per;
    const int r = static_cast<int>(t - b * per);
    const int span = group * tiles_n;
    const int first = r / span * group;
    const int rows = min(tiles_m - first, group);
    const int in = r % span;
    tm = first + in % rows;
    tn = in / rows;
  }
};

// The tiers, fastest first; each .cu defines its own.
struct Sm90Tier {
  static constexpr const char* kName = "sm90_wgmma";
  static constexpr const char* kWhen =
      "sm_90, 16-bit inputs with K or the rows of each operand contiguous (row- or column-major), "
      "or tf32 and fp8 inputs with K contiguous in both: TMA, wgmma, persistent, warp-specialized, "
      "the output by TMA stores; a partly filled last wave's tiles split over K; activations swiglu and "
      "geglu (16-bit output, K-major operands, N a multiple of 128, TMA-stored) in the epilogue on whole tiles; "
      "fp8 e4m3 with block-wise scales on 128 x 128 tiles, each 128-deep block of K scaled as it is added";
  struct Plan {
    bool pingpong = false;  // else cooperative (gemm_sm90.cuh says what each is)
    bool gated = false;     // activation swiglu or geglu, in the epilogue (gemm_sm90_swiglu.cuh)
    bool blocks = false;    // block-wise scales: the block-scaled schedule (gemm_sm90_work.cuh)
    int group = 8;          // TileOrder::group
    int splits = 1;         // cooperative: the tiles from `whole` on each split into chunks of K
    int64_t whole = 0;
    int grid = 0;
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

// At most 16 rows against a weight with K contiguous on Hopper: the weight streamed into a ring of
// shared-memory stages by the copy engine, several stages deep on every SM (gemv_sm90.cu).
struct GemvTier {
  static constexpr const char* kName = "gemv_sm90";
  static constexpr const char* kWhen =
      "sm_90, M <= 16, one matrix, 16-bit inputs, both operands with K contiguous and rows the "
      "copy engine can address, K a multiple of 64, no activation swiglu/geglu, no explicit config: "
      "the weight streamed by tensor copies into a ring of shared-memory stages, K split only where "
      "the row blocks are fewer than two an SM";
  struct Plan {
    int blocks = 0, splits = 1, seg_stages = 0, k_stages = 0, grid = 0;
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

// Few rows against a weight with K contiguous (x @ W^T at decode and small batch): the weight
// streamed once across every SM in 16-byte runs, mma.sync, K split where its columns are few
// (gemm_skinny.cu).
struct SkinnyTier {
  static constexpr const char* kName = "skinny";
  static constexpr const char* kWhen =
      "sm_80 on, M <= 32, one matrix, 16-bit inputs, `other` with K contiguous (x @ W^T) and "
      "16-byte aligned rows, K a multiple of 8, no explicit config: the weight streamed at the "
      "copy rate, K split over the SMs where the columns are few";
  struct Plan {
    int m_tiles = 1;  // M padded to 16 m_tiles
    int splits = 1;   // chunks of K, summed in order by the last CTA of each column block
    int64_t chunk = 0;
    int64_t blocks = 0;  // column blocks
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

// float32 with TF32 allowed and an operand whose K is not contiguous: that operand copied
// K-contiguous into scratch, then the sm90 tiers (gemm_relayout.cu), since wgmma reads tf32
// K-major only.
struct RelayoutTier {
  static constexpr const char* kName = "sm90_relayout";
  static constexpr const char* kWhen =
      "sm_90, float32 with TF32 allowed, an operand whose K is not contiguous: copied "
      "K-contiguous (a tiled transpose), then the sm90 tiers";
  struct Plan {
    bool a = false, b = false;  // which operands are copied
    GemmCtx ctx;                // for the sm90 tiers that then run
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

// The portable tensor-core tier, for sm_80 on (A100, L40, and Hopper where sm_90a code is not
// built): mma.sync on fragments loaded with ldmatrix, asynchronous copies filling a multistage ring
// (gemm_sm80.cu).
struct Sm80Tier {
  static constexpr const char* kName = "sm80_mma";
  static constexpr const char* kWhen =
      "sm_80 on, 16-bit inputs, each operand with K or its rows contiguous: mma.sync, asynchronous copies";
  struct Plan {
    int tile = 0;       // 128 x 128 tiles on 0: 4 warps, 1: 8 warps (gemm_sm80.cu's shapes)
    int group = 8;      // TileOrder::group
    dim3 grid;
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

// The autotuner's side for matmul (gemm_tune.cu): the cache key of a call, its candidate
// configs (the default first), and the config a call runs with: the override where one is set
// (tests of every candidate), the cache's, a tuned one (tuning on first use), else the default.
std::string tune_key(const GemmArgs& g, const GemmCtx& ctx);
std::vector<GemmConfig> candidates(const GemmArgs& g, const GemmCtx& ctx);
GemmConfig tuned_config(const char* op, const GemmArgs& g, const GemmCtx& ctx, cudaStream_t stream);
void set_config_override(std::optional<GemmConfig> config);

// Runs the first tier that takes `g` (matmul.cu).
void run_gemm(const char* op, const GemmArgs& g, const GemmCtx& ctx, cudaStream_t stream);

// A grouped call's units (grouped_mm.cu), for kernels that walk output tiles of `tile_m` rows by
// `tile_n` columns group by group: into `prefix` (groups + 1 ints) the tiles before each group
// (prefix[groups]: all), into `ends` (groups ints) the groups' clamped ends (GemmArgs::offs); and
// C's rows past the last end zeroed; `next`, where given, zeroed (a kernel's counter of units dealt).
// Grouped over K: the ends clamped to K alone. Stream-ordered, no synchronization.
void grouped_prepare(const GemmArgs& g, int tile_m, int tile_n, int* prefix, int* ends, cudaStream_t stream,
                     int* next = nullptr);

// The SIMT tier's generic kernel's output tiles (kSimtTile square), and its launch over `grid`
// (gemm_simt_generic.cu).
constexpr int kSimtTile = 64;
void launch_simt_generic(const GemmArgs& g, dim3 grid, cudaStream_t stream);

struct SimtTier {
  static constexpr const char* kName = "simt";
  static constexpr const char* kWhen =
      "any dtype, layout and GPU, float32 FMAs: float32 operands on sm_80 on, each K-major or "
      "MN-major with 16-byte aligned rows, on 128 x 128 tiles (K split over CTAs where the tiles "
      "are few); anything else on 64 x 64 tiles through the strides";
  struct Plan {
    bool fast = false;  // the float32 kernel (else the generic one)
    bool a_kmajor = false, b_kmajor = false;  // fast: each operand's contiguous dimension is K
    TileOrder order;  // fast: the output tiles in grouped order
    int splits = 1, chunk = 0;  // fast: K split over `splits` CTAs a tile, `chunk` of K each
    dim3 grid;
    std::string describe() const;
  };
  // Anything but the gated activations, which matmul gives the sm90 tier only (it runs the rest as
  // the product, then tessera::swiglu or geglu_blocks).
  static bool can_implement(const GemmArgs& g, const GemmCtx&) { return !is_gated(g.activation); }
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

}  // namespace tessera::matrix
