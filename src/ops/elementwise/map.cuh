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

template <class T, int NIN, class F>
struct MapCall {
  const TensorView* out;
  std::array<const TensorView*, NIN> ins;
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

template <class T, int NIN, class F>
struct ContiguousTier {
  static constexpr const char* kName = "contiguous";
  static constexpr const char* kWhen = "every tensor contiguous";
  static bool can_implement(const MapCall<T, NIN, F>& c, int) {
    bool dense = c.out->is_contiguous();
    for (const TensorView* t : c.ins) dense = dense && t->is_contiguous();
    return dense;
  }
  static MapPlan plan(const MapCall<T, NIN, F>& c, int) {
    return {tile::map_config<NIN>(c.out->numel(), static_cast<const T*>(c.out->data), c.in, c.sms), 0};
  }
  static void launch(const MapCall<T, NIN, F>& c, const MapPlan& p, cudaStream_t s) {
    tile::launch_map_contiguous<NIN>(c.out->numel(), static_cast<T*>(c.out->data), c.in, c.f, p.config, s);
  }
};

template <class T, int NIN, class F>
struct StridedTier {
  static constexpr const char* kName = "strided";
  static constexpr const char* kWhen = "any other layout";
  static bool can_implement(const MapCall<T, NIN, F>&, int) { return true; }
  static MapPlan plan(const MapCall<T, NIN, F>& c, int) { return {{}, tile::map_strided_grid(c.out->numel(), c.sms)}; }
  static void launch(const MapCall<T, NIN, F>& c, const MapPlan&, cudaStream_t s) {
    std::array<const TensorView*, NIN + 1> all{c.out};
    for (int k = 0; k < NIN; ++k) all[k + 1] = c.ins[k];
    tile::launch_map_strided<NIN>(c.out->numel(), static_cast<T*>(c.out->data), c.in,
                                  runtime::make_indexer<NIN + 1>(all), c.f, c.sms, s);
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

// out = F<fast>{}(ins...) elementwise, in float32, for float32, float16 and bfloat16 tensors of
// out's dtype (fast: the half types, see exp_). The caller has checked the arguments.
template <template <bool> class F, int NIN>
void map_floats(const char* op, const TensorView& out, const std::array<const TensorView*, NIN>& ins,
                cudaStream_t s) {
  runtime::DeviceGuard guard(out.device.index);
  const auto run = [&](auto type) {
    using T = decltype(type);
    using Fn = F<!std::is_same_v<T, float>>;
    MapCall<T, NIN, Fn> c{&out, ins, {}, Fn{}, runtime::device_props(out.device.index).multiProcessorCount};
    for (int k = 0; k < NIN; ++k) c.in.p[k] = static_cast<const T*>(ins[k]->data);
    runtime::run_first<ContiguousTier<T, NIN, Fn>, StridedTier<T, NIN, Fn>>(op, c, out.device.index, s);
  };
  switch (out.dtype) {
    case DType::float32: run(float{}); break;
    case DType::float16: run(__half{}); break;
    default: run(__nv_bfloat16{}); break;
  }
  TESSERA_LAUNCH_CHECK();
}

}  // namespace tessera::elementwise
