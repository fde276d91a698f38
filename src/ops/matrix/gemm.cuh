// What every GEMM kernel tier shares: the arguments as the launcher resolved them, the fused
// epilogue, and the order in which a persistent grid walks the output tiles.
//
// C[b] = A[b] B[b] with A [M, K], B [K, N], C [M, N], each with its own element strides (batch
// stride 0: one matrix shared by every batch). The epilogue turns the float32 accumulator of one
// element into its stored value: activation(alpha * acc + bias[n]) + residual[b, m, n] +
// beta * C[b, m, n].
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "tessera/ops/matrix.hpp"
#include "tessera/tensor.hpp"
#include "tile/activation.cuh"
#include "tile/convert.cuh"

namespace tessera::matrix {

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
  float alpha = 1.0f, beta = 0.0f;
  Activation activation = Activation::none;
  bool allow_tf32 = false;
  int device = 0;
};

struct GemmCtx {
  int sms = 0;
  int major = 0;
};

// The epilogue as kernels take it, typed by the output dtype.
template <class OutT>
struct Epilogue {
  OutT* c;
  int64_t c_sb, c_sm, c_sn;
  const OutT* bias;
  int64_t bias_sn;
  const OutT* residual;
  int64_t r_sb, r_sm, r_sn;
  float alpha, beta;
  Activation activation;

  static Epilogue from(const GemmArgs& g) {
    return {static_cast<OutT*>(g.c), g.c_sb, g.c_sm, g.c_sn,
            static_cast<const OutT*>(g.bias), g.bias_sn,
            static_cast<const OutT*>(g.residual), g.r_sb, g.r_sm, g.r_sn,
            g.alpha, g.beta, g.activation};
  }

  // Stores element (b, m, n) from its accumulator. Fast: the MUFU forms of the activations, for
  // half-type outputs.
  template <bool Fast>
  __device__ __forceinline__ void store(int64_t b, int64_t m, int64_t n, float acc) const {
    OutT* p = c + b * c_sb + m * c_sm + n * c_sn;
    *p = tile::from_float<OutT>(value<Fast>(b, m, n, acc, p));
  }

  // Elements (b, m, n) and (b, m, n + 1), the second where `both`: one store of the pair where
  // the row is contiguous there and the pair aligned, else one store each.
  template <bool Fast>
  __device__ __forceinline__ void store2(int64_t b, int64_t m, int64_t n, float acc0, float acc1,
                                         bool both) const {
    OutT* p = c + b * c_sb + m * c_sm + n * c_sn;
    if (both && c_sn == 1 && reinterpret_cast<uintptr_t>(p) % (2 * sizeof(OutT)) == 0) {
      const float v0 = value<Fast>(b, m, n, acc0, p), v1 = value<Fast>(b, m, n + 1, acc1, p + 1);
      Pair pair{tile::from_float<OutT>(v0), tile::from_float<OutT>(v1)};
      *reinterpret_cast<Pair*>(p) = pair;
      return;
    }
    *p = tile::from_float<OutT>(value<Fast>(b, m, n, acc0, p));
    if (both) store<Fast>(b, m, n + 1, acc1);
  }

 private:
  struct alignas(2 * sizeof(OutT)) Pair {
    OutT x, y;
  };

  // The stored value of element (b, m, n) at p, in float32.
  template <bool Fast>
  __device__ __forceinline__ float value(int64_t b, int64_t m, int64_t n, float acc, const OutT* p) const {
    float v = alpha * acc;
    if (bias) v += tile::to_float(bias[n * bias_sn]);
    switch (activation) {
      case Activation::relu: v = tile::Relu{}(v); break;
      case Activation::gelu: v = tile::GeluErf<Fast>{}(v); break;
      case Activation::gelu_tanh: v = tile::GeluTanh<Fast>{}(v); break;
      case Activation::silu: v = tile::Silu<Fast>{}(v); break;
      default: break;
    }
    if (residual) v += tile::to_float(residual[b * r_sb + m * r_sm + n * r_sn]);
    if (beta != 0.0f) v += beta * tile::to_float(*p);
    return v;
  }
};

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
      "sm_90, 16-bit inputs, each operand with K or its rows contiguous (row- or column-major): "
      "TMA, wgmma, persistent, warp-specialized";
  struct Plan {
    int bn = 256, grid = 0;
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs& g, const GemmCtx& ctx);
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

struct SimtTier {
  static constexpr const char* kName = "simt";
  static constexpr const char* kWhen = "any dtype, layout and GPU: float32 FMAs on 64 x 64 tiles";
  struct Plan {
    dim3 grid;
    std::string describe() const;
  };
  static bool can_implement(const GemmArgs&, const GemmCtx&) { return true; }
  static Plan plan(const GemmArgs& g, const GemmCtx& ctx);
  static void launch(const GemmArgs& g, const Plan& p, cudaStream_t stream);
};

}  // namespace tessera::matrix
