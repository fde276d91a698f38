// Shared by the attention test files: host tensors of doubles, random inputs, uploads in a dtype
// (and the rounding the kernels see), and the GPU-against-reference runner of the forward.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "ops/attention/attention_reference.hpp"
#include "runtime/memory.hpp"
#include "tessera/ops/attention.hpp"

namespace tessera::testing::attention {

using tessera::DType;
using tessera::TensorView;
namespace ref = tessera::reference;

inline const tessera::Device kCpu{tessera::DeviceType::cpu, 0};
inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline TensorView host(std::vector<double>& v, std::initializer_list<int64_t> shape) {
  return TensorView::contiguous(v.data(), DType::float64, shape, kCpu);
}

inline std::vector<double> randn(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist;
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}


struct GpuCase {
  int64_t b, sq, sk, hq, hk, d, dv;
  ref::AttentionSpec spec;
  bool heads_major;  // the tensors stored [batch, heads, seq, dim] (torch's SDPA layout)
};

// A double rounded to dt's storage and its bytes, and back.
inline void store_as(DType dt, double x, unsigned char* at) {
  if (dt == DType::float32) {
    const float f = static_cast<float>(x);
    std::memcpy(at, &f, 4);
  } else if (dt == DType::float16) {
    const __half f = __float2half(static_cast<float>(x));
    std::memcpy(at, &f, 2);
  } else {
    const __nv_bfloat16 f = __float2bfloat16(static_cast<float>(x));
    std::memcpy(at, &f, 2);
  }
}
inline double load_as(DType dt, const unsigned char* at) {
  if (dt == DType::float32) {
    float f;
    std::memcpy(&f, at, 4);
    return f;
  }
  if (dt == DType::float16) {
    __half f;
    std::memcpy(&f, at, 2);
    return __half2float(f);
  }
  __nv_bfloat16 f;
  std::memcpy(&f, at, 2);
  return __bfloat162float(f);
}

// Uploads host doubles as `dt` in the case's storage order; returns the [batch, seq, heads, dim]
// view of it (a transposed view when heads_major).
inline TensorView upload(tessera::runtime::DeviceBuffer& buf, const std::vector<double>& x, DType dt, int64_t b,
                  int64_t s, int64_t h, int64_t d, bool heads_major) {
  const size_t es = dt == DType::float32 ? 4 : 2;
  std::vector<unsigned char> bytes(x.size() * es);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t si = 0; si < s; ++si)
      for (int64_t hi = 0; hi < h; ++hi)
        for (int64_t di = 0; di < d; ++di) {
          const int64_t at = heads_major ? ((bi * h + hi) * s + si) * d + di : ((bi * s + si) * h + hi) * d + di;
          store_as(dt, x[((bi * s + si) * h + hi) * d + di], &bytes[at * es]);
        }
  buf = tessera::runtime::DeviceBuffer(bytes.size());
  EXPECT_EQ(cudaMemcpy(buf.data(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  const int64_t shape[4] = {b, s, h, d};
  const int64_t strides[4] = {heads_major ? h * s * d : s * h * d, heads_major ? d : h * d,
                              heads_major ? s * d : d, 1};
  return TensorView::make(buf.data(), dt, shape, strides, 4, tessera::Device{tessera::DeviceType::cuda, 0});
}

// x rounded to dt, as the kernels see it.
inline std::vector<double> rounded(DType dt, std::vector<double> x) {
  unsigned char bytes[4];
  for (double& e : x) store_as(dt, e, bytes), e = load_as(dt, bytes);
  return x;
}

// A contiguous device tensor of `shape` in buf.
inline TensorView alloc(tessera::runtime::DeviceBuffer& buf, std::initializer_list<int64_t> shape, DType dt) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  buf = tessera::runtime::DeviceBuffer(std::max<int64_t>(n, 1) * (dt == DType::float32 ? 4 : 2));
  return TensorView::contiguous(buf.data(), dt, shape, tessera::Device{tessera::DeviceType::cuda, 0});
}

// The first n elements of a device buffer of dt, as doubles.
inline std::vector<double> download(DType dt, const tessera::runtime::DeviceBuffer& buf, size_t n) {
  const size_t es = dt == DType::float32 ? 4 : 2;
  std::vector<unsigned char> raw(n * es);
  EXPECT_EQ(cudaMemcpy(raw.data(), buf.data(), raw.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<double> got(n);
  for (size_t i = 0; i < n; ++i) got[i] = load_as(dt, &raw[i * es]);
  return got;
}

// ALiBi's slopes of spec (the reference's) on the device, float32 [heads_q] or [batch, heads_q] as
// many as it holds, in buf and view; null without slopes.
inline const TensorView* device_slopes(tessera::runtime::DeviceBuffer& buf, TensorView& view,
                                       const ref::AttentionSpec& spec, int64_t heads_q) {
  const std::vector<double>& s = spec.alibi_slopes;
  if (s.empty()) return nullptr;
  const std::vector<float> f(s.begin(), s.end());
  buf = tessera::runtime::DeviceBuffer(f.size() * 4);
  EXPECT_EQ(cudaMemcpy(buf.data(), f.data(), f.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  const tessera::Device dev{tessera::DeviceType::cuda, 0};
  const int64_t n = int64_t(f.size());
  view = n == heads_q ? TensorView::contiguous(buf.data(), DType::float32, {n}, dev)
                      : TensorView::contiguous(buf.data(), DType::float32, {n / heads_q, heads_q}, dev);
  return &view;
}

// spec with ALiBi's slopes: n of them (heads_q, or batch * heads_q), random in [0.02, 0.5) and
// exact in float32.
inline ref::AttentionSpec with_alibi(ref::AttentionSpec spec, int64_t n, unsigned seed = 77) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(0.02f, 0.5f);
  spec.alibi_slopes.resize(size_t(n));
  for (double& x : spec.alibi_slopes) x = dist(gen);
  return spec;
}

inline tessera::AttentionOptions options_of(const ref::AttentionSpec& spec) {
  tessera::AttentionOptions o;
  o.scale = spec.scale, o.causal = spec.causal, o.window_left = spec.window_left, o.window_right = spec.window_right;
  o.softcap = spec.softcap;
  return o;
}

inline double rel_err(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "element " << i;
      continue;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline void run_gpu_case(const GpuCase& c, DType dt, double tol, tessera::AttentionTier tier) {
  std::vector<double> q = randn(c.b * c.sq * c.hq * c.d, 21), k = randn(c.b * c.sk * c.hk * c.d, 22),
                      v = randn(c.b * c.sk * c.hk * c.dv, 23);
  tessera::runtime::DeviceBuffer bq, bk, bv, bo, bl, ba;
  const TensorView tq = upload(bq, q, dt, c.b, c.sq, c.hq, c.d, c.heads_major);
  const TensorView tk = upload(bk, k, dt, c.b, c.sk, c.hk, c.d, c.heads_major);
  const TensorView tv = upload(bv, v, dt, c.b, c.sk, c.hk, c.dv, c.heads_major);
  const TensorView tout = alloc(bo, {c.b, c.sq, c.hq, c.dv}, dt), tl = alloc(bl, {c.b, c.hq, c.sq}, DType::float32);
  TensorView ta;
  tessera::AttentionOptions o = options_of(c.spec);
  o.tier = tier, o.alibi_slopes = device_slopes(ba, ta, c.spec, c.hq);
  tessera::attention(tq, tk, tv, tout, &tl, o, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The reference sees the inputs rounded to dt, as the kernel does.
  std::vector<double> rq = rounded(dt, q), rk = rounded(dt, k), rv = rounded(dt, v);
  const auto want = ref::attention_forward(host(rq, {c.b, c.sq, c.hq, c.d}), host(rk, {c.b, c.sk, c.hk, c.d}),
                                           host(rv, {c.b, c.sk, c.hk, c.dv}), c.spec);
  const std::vector<double> got = download(dt, bo, want.out.size());
  std::vector<double> lse(want.lse.size());
  std::vector<float> lf(lse.size());
  ASSERT_EQ(cudaMemcpy(lf.data(), bl.data(), lf.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < lf.size(); ++i) lse[i] = lf[i];
  EXPECT_LE(rel_err(got, want.out), tol);
  EXPECT_LE(rel_err(lse, want.lse), 1e-5);
}

inline ref::AttentionSpec spec(bool causal, int64_t wl, int64_t wr, double cap) {
  ref::AttentionSpec s;
  s.causal = causal, s.window_left = wl, s.window_right = wr, s.softcap = cap;
  return s;
}

inline std::string name_of(const GpuCase& c) {
  return "b=" + std::to_string(c.b) + " sq=" + std::to_string(c.sq) + " sk=" + std::to_string(c.sk) +
         " hq=" + std::to_string(c.hq) + " hk=" + std::to_string(c.hk) + " d=" + std::to_string(c.d) +
         (c.spec.causal ? " causal" : "") + " window=(" + std::to_string(c.spec.window_left) + ", " +
         std::to_string(c.spec.window_right) + ") softcap=" + std::to_string(c.spec.softcap) +
         (c.heads_major ? " [b, h, s, d]" : "") +
         (c.spec.alibi_slopes.empty() ? "" : " alibi x" + std::to_string(c.spec.alibi_slopes.size()));
}

}  // namespace tessera::testing::attention
