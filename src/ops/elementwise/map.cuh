// The host side that every float elementwise map shares (gelu, silu, their backwards): the
// dtype dispatch and the two kernel tiers, contiguous (vectors of 16 bytes where every pointer
// allows) and strided (any layout, broadcast inputs with stride 0). An op file holds the functor,
// one call of check_map (or check_map_backward) and one of map_floats.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <string>
#include <type_traits>

#include "runtime/check.hpp"
#include "runtime/device.hpp"
#include "runtime/layout.hpp"
#include "runtime/tier.hpp"
#include "runtime/validate.hpp"
#include "tessera/tensor.hpp"
#include "tile/map.cuh"

namespace tessera::elementwise {

template <class T, int NIN, class F, int NOUT = 1>
struct MapCall {
  std::array<const TensorView*, NOUT> outs;
  std::array<const TensorView*, NIN> ins;
  tile::Outputs<T, NOUT> out;
  tile::Inputs<T, NIN> in;
  F f;
  int sms;
};

struct MapPlan {
  tile::MapConfig config{};
  unsigned grid = 0;  // strided tier
  std::string describe() const {
    if (grid) return std::to_string(grid) + " CTAs of " + std::to_string(tile::kMapThreads) + " threads";
    return std::string(config.vec ? "16-byte vectors" : "single elements") + ", " + std::to_string(config.unroll) +
           " per thread";
  }
};

template <class T, int NIN, class F, int NOUT = 1>
struct ContiguousTier {
  static constexpr const char* kName = "contiguous";
  static constexpr const char* kWhen = "every tensor contiguous";
  static bool can_implement(const MapCall<T, NIN, F, NOUT>& c, int) {
    bool dense = true;
    for (const TensorView* t : c.outs) dense = dense && t->is_contiguous();
    for (const TensorView* t : c.ins) dense = dense && t->is_contiguous();
    return dense;
  }
  static MapPlan plan(const MapCall<T, NIN, F, NOUT>& c, int) {
    return {tile::map_config<NIN>(c.outs[0]->numel(), c.out, c.in, c.sms), 0};
  }
  static void launch(const MapCall<T, NIN, F, NOUT>& c, const MapPlan& p, cudaStream_t s) {
    tile::launch_map_contiguous<NIN>(c.outs[0]->numel(), c.out, c.in, c.f, p.config, s);
  }
};

// Every tensor's last dimension contiguous, whole 16-byte vectors of it at 16-byte aligned
// addresses, and no broadcast along it: the strided walk a vector at a time.
template <class T, int NIN, class F, int NOUT = 1>
struct RowsTier {
  static constexpr const char* kName = "rows";
  static constexpr const char* kWhen = "each tensor's last dimension contiguous in 16-byte vectors";
  static constexpr int V = tile::kVec16<T>;
  static bool can_implement(const MapCall<T, NIN, F, NOUT>& c, int) {
    const auto fits = [&](const TensorView* t) {
      if (t->ndim < 1 || t->shape[t->ndim - 1] % V != 0 || t->strides[t->ndim - 1] != 1) return false;
      if (!tile::is_aligned<T, V>(t->data)) return false;
      for (int d = 0; d + 1 < t->ndim; ++d)
        if (t->shape[d] != 1 && t->strides[d] % V != 0) return false;
      return true;
    };
    bool ok = true;
    for (const TensorView* t : c.outs) ok = ok && fits(t);
    for (const TensorView* t : c.ins) ok = ok && fits(t) && t->ndim == c.outs[0]->ndim;
    return ok;
  }
  static MapPlan plan(const MapCall<T, NIN, F, NOUT>& c, int) {
    return {{}, tile::map_strided_grid(c.outs[0]->numel() / V, c.sms)};
  }
  static void launch(const MapCall<T, NIN, F, NOUT>& c, const MapPlan&, cudaStream_t s) {
    // The same views with the last dimension counted in vectors.
    std::array<TensorView, NIN + NOUT> vecs;
    std::array<const TensorView*, NIN + NOUT> all{};
    for (int k = 0; k < NIN + NOUT; ++k) {
      vecs[k] = k < NOUT ? *c.outs[k] : *c.ins[k - NOUT];
      vecs[k].shape[vecs[k].ndim - 1] /= V, vecs[k].strides[vecs[k].ndim - 1] = V;
      all[k] = &vecs[k];
    }
    tile::launch_map_rows<NIN>(c.outs[0]->numel() / V, c.out, c.in, runtime::make_indexer<NIN + NOUT>(all), c.f,
                               c.sms, s);
  }
};

template <class T, int NIN, class F, int NOUT = 1>
struct StridedTier {
  static constexpr const char* kName = "strided";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const MapCall<T, NIN, F, NOUT>&, int) { return true; }
  static MapPlan plan(const MapCall<T, NIN, F, NOUT>& c, int) {
    return {{}, tile::map_strided_grid(c.outs[0]->numel(), c.sms)};
  }
  static void launch(const MapCall<T, NIN, F, NOUT>& c, const MapPlan&, cudaStream_t s) {
    std::array<const TensorView*, NIN + NOUT> all{};
    for (int k = 0; k < NOUT; ++k) all[k] = c.outs[k];
    for (int k = 0; k < NIN; ++k) all[NOUT + k] = c.ins[k];
    tile::launch_map_strided<NIN>(c.outs[0]->numel(), c.out, c.in, runtime::make_indexer<NIN + NOUT>(all), c.f,
                                  c.sms, s);
  }
};

// The checks of a float map out = f(x): x a float CUDA tensor, out like x, out not overlapping x
// unless it is x. False when there is nothing to do (0 elements).
inline bool check_map(const char* op, const TensorView& x, const TensorView& out) {
  detail::check_cuda_tensor(op, "input", x);
  detail::check_dtype_in(op, "input", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "out", out, "input", x);
  detail::check_no_internal_overlap(op, "out", out);
  detail::check_no_overlap(op, "out", out, "input", x, /*allow_identical=*/true);
  return out.numel() > 0;
}

// The same for its backward grad_in = g(grad_out, x).
inline bool check_map_backward(const char* op, const TensorView& grad_out, const TensorView& x,
                               const TensorView& grad_in) {
  detail::check_cuda_tensor(op, "input", x);
  detail::check_dtype_in(op, "input", x, {DType::float32, DType::float16, DType::bfloat16});
  detail::check_like(op, "grad_output", grad_out, "input", x);
  detail::check_like(op, "out", grad_in, "input", x);
  detail::check_no_internal_overlap(op, "out", grad_in);
  detail::check_no_overlap(op, "out", grad_in, "input", x, true);
  detail::check_no_overlap(op, "out", grad_in, "grad_output", grad_out, true);
  return grad_in.numel() > 0;
}

// outs = F<fast>{}(ins...) elementwise, in float32, for float32, float16 and bfloat16 tensors of
// one shape and dtype (fast: the half types, see exp_); F returns a float, or tile::Floats<NOUT>
// for NOUT outputs written in the same pass. The caller has checked the arguments.
template <template <bool> class F, int NIN, int NOUT>
void map_floats(const char* op, const std::array<const TensorView*, NOUT>& outs,
                const std::array<const TensorView*, NIN>& ins, cudaStream_t s) {
  const TensorView& out = *outs[0];
  runtime::DeviceGuard guard(out.device.index);
  const auto run = [&](auto type) {
    using T = decltype(type);
    using Fn = F<!std::is_same_v<T, float>>;
    MapCall<T, NIN, Fn, NOUT> c{outs, ins, {}, {}, Fn{}, runtime::device_props(out.device.index).multiProcessorCount};
    for (int k = 0; k < NOUT; ++k) c.out.p[k] = static_cast<T*>(outs[k]->data);
    for (int k = 0; k < NIN; ++k) c.in.p[k] = static_cast<const T*>(ins[k]->data);
    runtime::run_first<ContiguousTier<T, NIN, Fn, NOUT>, RowsTier<T, NIN, Fn, NOUT>, StridedTier<T, NIN, Fn, NOUT>>(
        op, c, out.device.index, s);
  };
  switch (out.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
  TESSERA_LAUNCH_CHECK();
}

template <template <bool> class F, int NIN>
void map_floats(const char* op, const TensorView& out, const std::array<const TensorView*, NIN>& ins,
                cudaStream_t s) {
  map_floats<F, NIN, 1>(op, {&out}, ins, s);
}

}  // namespace tessera::elementwise
